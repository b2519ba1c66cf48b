#!/usr/bin/env bash
# Sets everything up, builds, and runs the whole test suite (unit + integration tiers).
# ctest's summary is the last thing printed. Soak and fuzz runs have their own labels:
#   ctest --test-dir build -L fuzz
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --preset default --parallel 2
