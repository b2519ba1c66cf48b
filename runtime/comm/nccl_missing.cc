// Built when CUDA or NCCL was not found: the NCCL backend says so plainly.

#include "common/error.h"
#include "runtime/comm/backend.h"

namespace cxxlaunch::runtime {

bool ncclCompiledIn() { return false; }

std::unique_ptr<Backend> makeNcclBackend(const BackendOptions&) {
  throw InvalidArgument(
      "this cxxlaunch was built without CUDA and NCCL: use the gloo backend "
      "(CXXLAUNCH_BACKEND=gloo), or rebuild where nvcc and NCCL are found");
}

}  // namespace cxxlaunch::runtime
