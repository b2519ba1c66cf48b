#!/usr/bin/env bash
# Sets everything up, builds, and runs the example job: two CPU workers under cxxlaunch.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build/bin/cxxlaunch run --nproc_per_node=2 build/bin/hello_world
