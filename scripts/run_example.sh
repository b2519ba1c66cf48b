#!/usr/bin/env bash
# Sets everything up, builds, and runs the example job: a small GPT language model trained
# data-parallel (DDP over Gloo) by two CPU workers under cxxlaunch.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build/bin/cxxlaunch run --nproc_per_node=2 build/bin/train --model gpt --steps 60 --print_every 10 --lr 1e-2
