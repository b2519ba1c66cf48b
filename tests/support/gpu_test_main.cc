// The main of the GPU tests (kernels_cuda_test, runtime_nccl_test): without a CUDA device they are
// reported as skipped (support/skip_main.h).
#define CATCH_CONFIG_RUNNER
#include "runtime/kernels/cuda/device.h"
#include "skip_main.h"  // beside this file

int main(int argc, char** argv) {
  return cxxlaunch::testing::runUnlessMissing(argc, argv, []() -> std::string {
    return cxxlaunch::runtime::kernels::cuda::deviceCount() == 0 ? "no CUDA device here" : "";
  });
}
