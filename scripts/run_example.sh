#!/usr/bin/env bash
# Sets everything up, builds, and runs the example job: a small GPT language model trained
# data-parallel (DDP over Gloo) by two CPU workers under cxxlaunch. Then the same under ZeRO-3
# with checkpoints every 10 steps and a worker that dies at step 25: --max_restarts restarts the
# group, which resumes from the step-20 checkpoint and finishes.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh cxxlaunch train  # only what the example runs; scripts/test.sh builds the rest
build/bin/cxxlaunch run --nproc_per_node=2 build/bin/train --model gpt --steps 60 --print_every 10 --lr 1e-2
checkpoints=$(mktemp -d)
trap 'rm -rf "$checkpoints"' EXIT
build/bin/cxxlaunch run --nproc_per_node=2 --use_deepspeed --zero_stage 3 --max_restarts 1 \
  --checkpoint_dir "$checkpoints" \
  build/bin/train --model gpt --steps 40 --print_every 10 --lr 1e-2 --save_every 10 --crash_at_step 25
