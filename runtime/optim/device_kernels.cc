#include "runtime/optim/device_kernels.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include "common/error.h"
#include "runtime/kernels/cpu/optimizers.h"
#if defined(CXXLAUNCH_HAVE_CUDA_KERNELS)
#include "runtime/kernels/cuda/optimizers.h"
#endif

namespace cxxlaunch::runtime::device_kernels {
namespace {

constexpr int64_t kGrain = 32768;  // elements per task: amortises a task, still shares out

#if defined(CXXLAUNCH_HAVE_CUDA_KERNELS)
namespace cuda = kernels::cuda;
constexpr cuda::Stream kStream = nullptr;  // the legacy default stream
#endif

[[noreturn, maybe_unused]] void noCudaKernels() {
  throw InvalidArgument(
      "a GPU tensor reached the shard kernels, but this cxxlaunch was built without its CUDA "
      "kernels (nvcc was not found at build time); rebuild where nvcc works");
}

}  // namespace

void adamStep(c10::Device device, float* param, const float* grad, float* exp_avg,
              float* exp_avg_sq, int64_t n, const kernels::AdamScalars& s) {
  if (device.is_cuda()) {
#if defined(CXXLAUNCH_HAVE_CUDA_KERNELS)
    cuda::adamStep(param, grad, exp_avg, exp_avg_sq, n, s, kStream);
    return;
#else
    noCudaKernels();
#endif
  }
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    kernels::adamStep(param + b, grad + b, exp_avg + b, exp_avg_sq + b, e - b, s);
  });
}

void sgdStep(c10::Device device, float* param, const float* grad, float* momentum_buffer, int64_t n,
             const kernels::SgdScalars& s) {
  if (device.is_cuda()) {
#if defined(CXXLAUNCH_HAVE_CUDA_KERNELS)
    cuda::sgdStep(param, grad, momentum_buffer, n, s, kStream);
    return;
#else
    noCudaKernels();
#endif
  }
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    kernels::sgdStep(param + b, grad + b,
                     momentum_buffer == nullptr ? nullptr : momentum_buffer + b, e - b, s);
  });
}

double sumOfSquares(const at::Tensor& x) {
  if (x.is_cuda()) {
#if defined(CXXLAUNCH_HAVE_CUDA_KERNELS)
    at::Tensor scratch = at::empty({cuda::kSumOfSquaresScratch}, x.options().dtype(at::kDouble));
    cuda::sumOfSquares(x.data_ptr<float>(), x.numel(), scratch.data_ptr<double>(),
                       /*accumulate=*/false, kStream);
    return cuda::readDouble(scratch.data_ptr<double>(), kStream);
#else
    noCudaKernels();
#endif
  }
  return kernels::sumOfSquares(x.data_ptr<float>(), x.numel());
}

void scaleInPlace(const at::Tensor& x, float factor) {
  if (x.is_cuda()) {
#if defined(CXXLAUNCH_HAVE_CUDA_KERNELS)
    cuda::scaleInPlace(x.data_ptr<float>(), x.numel(), factor, kStream);
    return;
#else
    noCudaKernels();
#endif
  }
  kernels::scaleInPlace(x.data_ptr<float>(), x.numel(), factor);
}

bool allFinite(const at::Tensor& x) {
  if (x.is_cuda()) {
#if defined(CXXLAUNCH_HAVE_CUDA_KERNELS)
    at::Tensor flag = at::empty({1}, x.options().dtype(at::kInt));
    cuda::clearFlag(flag.data_ptr<int32_t>(), kStream);
    cuda::checkFinite(x.data_ptr<float>(), x.numel(), flag.data_ptr<int32_t>(), kStream);
    return !cuda::readFlag(flag.data_ptr<int32_t>(), kStream);
#else
    noCudaKernels();
#endif
  }
  return kernels::allFinite(x.data_ptr<float>(), x.numel());
}

}  // namespace cxxlaunch::runtime::device_kernels
