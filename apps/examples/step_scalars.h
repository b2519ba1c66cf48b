#pragma once
// What the example trainers log at every optimizer step when the launch has trackers
// (--log_with): the loss, the learning rate, tokens/s, the step time and the memory report.
// A value that does not apply to the run is not logged, so that the report draws no series for
// it: the GPU's peak only where there is one (MemoryReport::device_peak is 0 on a CPU).

#include "runtime/accelerator.h"

namespace cxxlaunch::examples {

inline runtime::Scalars stepScalars(double loss, double lr, double tokens_per_s, double step_s,
                                    const runtime::MemoryReport& memory) {
  constexpr double kMiB = 1 << 20;
  runtime::Scalars scalars = {
      {"loss", loss},
      {"lr", lr},
      {"tokens_per_s", tokens_per_s},
      {"step_time_ms", step_s * 1e3},
      {"memory/parameters_mib", static_cast<double>(memory.parameters) / kMiB},
      {"memory/gradients_mib", static_cast<double>(memory.gradients) / kMiB},
      {"memory/optimizer_state_mib", static_cast<double>(memory.optimizer_state) / kMiB},
      {"memory/model_state_mib", static_cast<double>(memory.total()) / kMiB}};
  if (memory.device_peak > 0) {
    scalars.emplace_back("memory/device_peak_mib", static_cast<double>(memory.device_peak) / kMiB);
  }
  return scalars;
}

}  // namespace cxxlaunch::examples
