#!/usr/bin/env bash
# The installed API (docs/install.md#the-public-headers): installs BUILD into a temporary prefix
# and checks that the runtime's public headers are at most 8 (text/'s, a library of its own, are
# counted apart), that every installed header is one of cmake/install.cmake's list, and that
# each compiles alone, warnings as errors, in a project of its own that finds the package with
# find_package(cxxlaunch) as a user's does.
# Usage: installed_headers_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
test_name=installed_headers_test
source "$(dirname "$0")/installed_package.sh" "$@"

install_package
include=$prefix/include/cxxlaunch
mapfile -t headers < <(cd "$include" && find . -type f | sed 's|^\./||' | sort)
[ "${#headers[@]}" -gt 0 ] || fail "the install has no headers under $include"
printf 'installed: %s\n' "${headers[@]}"

# The list in cmake/install.cmake is the set: nothing else, nothing found by following includes.
listed=$(sed -n '/^set(CXXLAUNCH_PUBLIC_HEADERS/,/)/p; /^set(CXXLAUNCH_TEXT_HEADERS/,/)/p' \
  "$source_dir/cmake/install.cmake" | grep -o '[a-z_/]*\.h' | sort)
for header in "${headers[@]}"; do
  grep -qx "$header" <<<"$listed" || fail "$header is installed but not listed in cmake/install.cmake"
done
runtime_api=$(printf '%s\n' "${headers[@]}" | grep -vc '^text/' || true)
[ "$runtime_api" -le 8 ] || fail "$runtime_api public headers outside text/ (at most 8)"

# One translation unit per header, including it alone; text/'s link cxxlaunch::text.
project=$work/project
mkdir -p "$project"
{
  echo 'cmake_minimum_required(VERSION 3.25)'
  echo 'project(installed_headers LANGUAGES CXX)'
  echo 'set(CMAKE_CXX_STANDARD 20)'
  echo 'set(CMAKE_CXX_STANDARD_REQUIRED ON)'
  echo 'find_package(cxxlaunch CONFIG REQUIRED)'
} >"$project/CMakeLists.txt"
for header in "${headers[@]}"; do
  name=$(tr '/.' '__' <<<"$header")
  echo "#include \"$header\"  // alone: whatever it needs, it includes" >"$project/$name.cc"
  target=cxxlaunch::cxxlaunch
  [[ "$header" != text/* ]] || target=cxxlaunch::text
  {
    echo "add_library($name OBJECT $name.cc)"
    echo "target_link_libraries($name PRIVATE $target)"
    echo "target_compile_options($name PRIVATE -Wall -Wextra -Werror)"
  } >>"$project/CMakeLists.txt"
done

cmake -S "$project" -B "$work/build" "${configure_args[@]}" >"$work/configure.log" 2>&1 || {
  cat "$work/configure.log"
  fail "the header project does not configure against the installed package"
}
cmake --build "$work/build" --parallel 2 -- -k 0 >"$work/build.log" 2>&1 || {
  grep -E 'error|FAILED' "$work/build.log" | head -40
  fail "an installed header does not compile alone (above)"
}
echo "installed_headers_test: ok: ${#headers[@]} headers ($runtime_api outside text/) compile alone"
