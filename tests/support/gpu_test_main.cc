// The main of the GPU tests (kernels_cuda_test, runtime_nccl_test). Catch2 v2 (Debian 12's) has no
// SKIP, so without a CUDA device the program exits with 77 before running any test, and ctest
// (SKIP_RETURN_CODE 77) reports each test as skipped rather than passed. Listing the tests, which
// catch_discover_tests does at build time, works without a device.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>

#include "runtime/kernels/cuda/device.h"

int main(int argc, char** argv) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  const Catch::ConfigData& config = session.configData();
  const bool only_lists = config.listTests || config.listTestNamesOnly || config.listTags ||
                          config.listReporters || config.showHelp || config.libIdentify;
  if (!only_lists && cxxlaunch::runtime::kernels::cuda::deviceCount() == 0) {
    std::fprintf(stderr, "%s: no CUDA device here; skipped (exit code 77)\n", argv[0]);
    return 77;
  }
  return session.run();
}
