#!/usr/bin/env bash
# The suite under AddressSanitizer + UndefinedBehaviorSanitizer: the `debug` preset (build-debug/,
# Debug, -fsanitize=address,undefined), then its unit and integration tiers. Not part of the
# default run (a cold build takes most of an hour on 2 cores). Any report fails the test it
# happens in (halt_on_error); LibTorch's own leaks at exit are not ours (detect_leaks=0).
#
# usage: scripts/sanitize.sh [ctest arguments, e.g. -L unit or -R NAME]
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1 CCACHE_SLOPPINESS=pch_defines,time_macros
# handle_segv=0: a worker a test kills with SIGSEGV dies of it (exit 128+11), as it would
# unsanitized, instead of ASan aborting it (134).
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=0:abort_on_error=1:handle_segv=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
[ -f build-debug/build.ninja ] || cmake --preset debug >/dev/null
cmake --build --preset debug
# Not run here, and said so: the GPU check's dry run builds its own tree with its own flags, and
# the heap test checks glibc's malloc settings, which ASan's allocator replaces.
echo "sanitize: not run under ASan: gpu_check_dry_run, Blocks of megabytes come from the heap"
ctest --test-dir build-debug --output-on-failure --parallel 2 -L "unit|integration" \
  -E "gpu_check_dry_run|Blocks of megabytes come from the heap" "$@"
