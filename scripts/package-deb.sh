#!/usr/bin/env bash
# Makes the Debian package (docs/install.md): a CPU-only Release build in build-deb/ (Debian's
# LibTorch is CPU-only, and CUDA and NCCL are no Debian packages), installed under /usr, then
# `cpack -G DEB`. Only what the package holds is built. Prints the package's path last.
# Usage: scripts/package-deb.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-deb}
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1 CCACHE_SLOPPINESS=pch_defines,time_macros
# Release without debug information, at -O2: CI checks the warnings (errors) at -O2, and GCC 12's
# -O3 reports false -Wrestrict positives inside libstdc++. The runtime's hot loops get -O3 from
# their own CMakeLists.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
  -DCMAKE_INSTALL_PREFIX=/usr -DCXXLAUNCH_WITH_CUDA=OFF -DCXXLAUNCH_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" --target cxxlaunch cxxlaunchd cxxlaunch_selftest cxxlaunch_runtime
(cd "$build" && cpack -G DEB >/dev/null)
ls "$PWD/$build"/cxxlaunch_*.deb
