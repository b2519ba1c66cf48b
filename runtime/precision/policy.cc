#include "runtime/precision/policy.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include "common/error.h"

namespace cxxlaunch::runtime {

// LibTorch 2.4 replaced the per-device functions with ones taking the device type.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool autocastEnabled(c10::DeviceType d) { return at::autocast::is_autocast_enabled(d); }
static void setAutocastEnabled(c10::DeviceType d, bool on) {
  at::autocast::set_autocast_enabled(d, on);
}
c10::ScalarType autocastDtype(c10::DeviceType d) { return at::autocast::get_autocast_dtype(d); }
static void setAutocastDtype(c10::DeviceType d, c10::ScalarType t) {
  at::autocast::set_autocast_dtype(d, t);
}
#else
bool autocastEnabled(c10::DeviceType d) {
  return d == c10::DeviceType::CUDA ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
}
static void setAutocastEnabled(c10::DeviceType d, bool on) {
  if (d == c10::DeviceType::CUDA) {
    at::autocast::set_enabled(on);
  } else {
    at::autocast::set_cpu_enabled(on);
  }
}
c10::ScalarType autocastDtype(c10::DeviceType d) {
  return d == c10::DeviceType::CUDA ? at::autocast::get_autocast_gpu_dtype()
                                    : at::autocast::get_autocast_cpu_dtype();
}
static void setAutocastDtype(c10::DeviceType d, c10::ScalarType t) {
  if (d == c10::DeviceType::CUDA) {
    at::autocast::set_autocast_gpu_dtype(t);
  } else {
    at::autocast::set_autocast_cpu_dtype(t);
  }
}
#endif

PrecisionPolicy precisionPolicy(const std::string& mixed_precision, c10::DeviceType device) {
  PrecisionPolicy policy;
  policy.name = mixed_precision;
  if (mixed_precision == "no") return policy;
  if (mixed_precision == "bf16") {
    policy.compute = c10::ScalarType::BFloat16;
  } else if (mixed_precision == "fp16") {
    if (device != c10::DeviceType::CUDA) {
      throw InvalidArgument(
          "mixed precision fp16 needs a GPU: LibTorch has no half-precision matmul on CPU; use "
          "bf16 or no");
    }
    policy.compute = c10::ScalarType::Half;
  } else {
    throw InvalidArgument("mixed precision '" + mixed_precision +
                          "' is unknown; use no, bf16 or fp16");
  }
  return policy;
}

AutocastScope::AutocastScope(c10::DeviceType device, c10::ScalarType dtype, bool enabled)
    : device_(device),
      was_enabled_(autocastEnabled(device)),
      cache_was_enabled_(at::autocast::is_autocast_cache_enabled()),
      previous_dtype_(autocastDtype(device)) {
  if (enabled) {
    setAutocastDtype(device, dtype);
    at::autocast::set_autocast_cache_enabled(false);
  }
  setAutocastEnabled(device, enabled);
}

AutocastScope::~AutocastScope() {
  setAutocastEnabled(device_, was_enabled_);
  setAutocastDtype(device_, previous_dtype_);
  at::autocast::set_autocast_cache_enabled(cache_was_enabled_);
}

}  // namespace cxxlaunch::runtime
