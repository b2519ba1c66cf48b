#!/usr/bin/env bash
# Whether every C++ and CUDA source git tracks is as clang-format (.clang-format) writes it; the
# default test run calls this (ctest: clang_format_clean). Prints the files that are not, and how
# to fix them. Usage: scripts/check-format.sh   (exit 0: all formatted, 1: some are not)
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
# One run over all of them; each difference is reported as "FILE:LINE:COL: error: ...".
mapfile -t unformatted < <(clang-format --dry-run --Werror "${files[@]}" 2>&1 |
  sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error:.*/\1/p' | sort -u)
if ((${#unformatted[@]})); then
  echo "not as clang-format writes them (${#unformatted[@]} file(s)):"
  printf '  %s\n' "${unformatted[@]}"
  echo "fix: clang-format -i ${unformatted[*]}"
  exit 1
fi
echo "all ${#files[@]} C++ and CUDA sources are formatted"
