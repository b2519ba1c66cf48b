# Sourced by the tests of the installed package (installed_headers_test.sh, standalone_test.sh)
# with their SOURCE_DIR and BUILD_DIR, after they set `test_name`. Gives them: source_dir and
# build_dir; a work folder under the build (so that ccache, with paths relative to
# CCACHE_BASEDIR, hits on every rerun), removed on exit and on ctest's timeout; fail MESSAGE;
# install_package, which installs BUILD into $prefix; and configure_args, for a project of
# theirs configured against that prefix as BUILD was configured (CXXLAUNCH_BUILD_TYPE and
# CXXLAUNCH_CXX_FLAGS from the environment), with ccache and Ninja where they are.
source_dir=$(cd "$1" && pwd)
build_dir=$(cd "$2" && pwd)

work=$(mktemp -d "$build_dir/$test_name.XXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 143' TERM INT  # ctest's timeout: still clean up
prefix=$work/prefix

fail() {
  echo "$test_name: FAIL: $*" >&2
  exit 1
}

install_package() {
  cmake --install "$build_dir" --prefix "$prefix" >"$work/install.log" || {
    cat "$work/install.log"
    fail "cmake --install failed"
  }
}

export CCACHE_BASEDIR=$source_dir CCACHE_NOHASHDIR=1 CCACHE_SLOPPINESS=pch_defines,time_macros
configure_args=(-DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE="${CXXLAUNCH_BUILD_TYPE:-RelWithDebInfo}"
  -DCMAKE_CXX_FLAGS="${CXXLAUNCH_CXX_FLAGS:-}")
if command -v ccache >/dev/null; then configure_args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
if command -v ninja >/dev/null; then configure_args+=(-G Ninja); fi
