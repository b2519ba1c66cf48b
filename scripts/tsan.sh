#!/usr/bin/env bash
# The modules without LibTorch under ThreadSanitizer: common, rendezvous, launcher, text, the CPU
# kernels, and the integration tiers that run only their binaries (the `tsan` preset:
# build-tsan/, -fsanitize=thread). The runtime and its backends link LibTorch, whose threads
# TSan cannot see into; they are not built here. Not part of the default run.
#
# Any report fails the test it happens in (halt_on_error; a sanitized cxxlaunch or cxxlaunchd
# started by an integration test exits 66). gRPC and its libraries come from Debian
# uninstrumented: what they hand from one of their threads to another TSan does not see, so
# reports on those paths are suppressed (scripts/tsan.supp says which, why, and what that gives
# up).
#
# usage: scripts/tsan.sh [ctest arguments, e.g. -R NAME]
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1 CCACHE_SLOPPINESS=pch_defines,time_macros
[ -f build-tsan/build.ninja ] || cmake --preset tsan >/dev/null
cmake --build --preset tsan --target common_test rendezvous_test etcd_rendezvous_test launcher_test \
  kernels_cpu_test text_test \
  launcher_integration_test multinode_integration_test
# llvm-symbolizer: qualified names, which the suppressions match. handle_segv=0: a worker a test
# kills with SIGSEGV dies of it, as it would unsanitized, instead of TSan exiting 66 for it.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 history_size=4 \
ignore_noninstrumented_modules=1 handle_segv=0 suppressions=$PWD/scripts/tsan.supp \
external_symbolizer_path=$(command -v llvm-symbolizer || true)"
# TSan's shadow memory needs the address-space layout of gcc 12's runtime: no ASLR beyond 28 bits.
run=()
if [ "$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 28)" -gt 28 ]; then run=(setarch "$(uname -m)" -R); fi
"${run[@]}" ctest --test-dir build-tsan --output-on-failure --parallel 2 -L tsan -LE "soak|gpu" \
  -E "_NOT_BUILT" "$@"
