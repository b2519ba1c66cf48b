#!/usr/bin/env bash
# Gathers into one folder what a build on a machine without Debian's -dev packages lacks (the
# GPU machine of scripts/gpu-check.sh): the launcher and the daemon prebuilt here (they never link
# LibTorch), the rendezvous library prebuilt (the runtime's store client), the shared libraries
# these need (gRPC, Protobuf, Abseil, OpenSSL, yaml-cpp, ...; not glibc or libstdc++, which every
# Linux has), and the headers, library and CMake helpers of Gloo, nlohmann-json, Catch2 and CLI11.
# cmake/bundle.cmake is its reader. Runs here, after scripts/setup.sh; the folder stays under
# 44 MiB (it travels with the working tree, 64 MiB at most) or the script fails. It was 38 MiB
# before the etcd backend (issue 13) added its client to the launcher and the rendezvous library.
#
# usage: scripts/gpu-bundle.sh [FOLDER [BUILD]]
#   FOLDER: where to put it (default .gpu-bundle, ignored by git); BUILD: the build to take the
#   prebuilt pieces from (default build, the default preset's)
set -euo pipefail
cd "$(dirname "$0")/.."
bundle="${1:-.gpu-bundle}"
build="${2:-build}"
limit_mib=44

[ -f "$build/build.ninja" ] || scripts/setup.sh >/dev/null
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1 CCACHE_SLOPPINESS=pch_defines,time_macros
cmake --build "$build" --target cxxlaunch cxxlaunchd cxxlaunch_rendezvous cxxlaunch_proto >/dev/null

rm -rf "$bundle"
mkdir -p "$bundle"/{bin,lib,include,cmake}

# The binaries and archives without their debug sections (a quarter of the size); cxxlaunch,
# which links gRPC statically (cmake/static_deps.cmake), without its symbol table too (3.5 MiB).
strip --strip-all -o "$bundle/bin/cxxlaunch" "$build/bin/cxxlaunch"
strip --strip-debug -o "$bundle/bin/cxxlaunchd" "$build/bin/cxxlaunchd"
strip --strip-debug -o "$bundle/lib/libcxxlaunch_rendezvous.a" "$build/rendezvous/libcxxlaunch_rendezvous.a"
strip --strip-debug -o "$bundle/lib/libcxxlaunch_proto.a" "$build/proto/libcxxlaunch_proto.a"

# Every shared library the binaries and Gloo load, under its soname, except the C and C++
# runtimes, which the other machine has (and must keep: its LibTorch was built against them).
# (awk reads to the end: an early exit would kill ldconfig with SIGPIPE, failing the pipeline)
gloo_lib="$(ldconfig -p | awk '/libgloo\.so\.0 / && !seen {print $NF; seen = 1}')"
[ -n "$gloo_lib" ] || { echo "gpu-bundle: libgloo.so.0 not found (scripts/setup.sh installs it)" >&2; exit 1; }
system_lib='^(linux-vdso|ld-linux|libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s)\.so'
# (cxxlaunch is static where glibc's archives were there to link: ldd fails on such a binary)
dynamic=()
for file in "$bundle/bin/cxxlaunch" "$bundle/bin/cxxlaunchd" "$gloo_lib"; do
  if readelf -d "$file" | grep "(NEEDED)" >/dev/null; then dynamic+=("$file"); fi
done
ldd "${dynamic[@]}" |
  awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r soname path; do
    [[ "$soname" =~ $system_lib ]] || cp -L "$path" "$bundle/lib/$soname"
  done
cp -L "$gloo_lib" "$bundle/lib/libgloo.so.0"

# Headers (header-only libraries, and Gloo's), and Catch2's test discovery for CMake.
for dir in gloo nlohmann catch2 CLI; do
  [ -d "/usr/include/$dir" ] && cp -r "/usr/include/$dir" "$bundle/include/"
done
cp /usr/lib/cmake/Catch2/Catch.cmake /usr/lib/cmake/Catch2/CatchAddTests.cmake "$bundle/cmake/"

{
  echo "cxxlaunch GPU bundle, made $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
  echo "from commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
  echo "read by cmake/bundle.cmake; used by scripts/gpu-check.sh"
  echo
  (cd "$bundle" && find . -type f ! -name MANIFEST -printf '%s %p\n' | sort -k2)
} >"$bundle/MANIFEST"

size_kib=$(du -sk "$bundle" | cut -f1)
if ((size_kib > limit_mib * 1024)); then
  echo "gpu-bundle: $bundle is $((size_kib / 1024)) MiB, over the ${limit_mib} MiB limit" >&2
  exit 1
fi
echo "gpu-bundle: $bundle ($((size_kib / 1024)) MiB, $(find "$bundle" -type f | wc -l) files)"
