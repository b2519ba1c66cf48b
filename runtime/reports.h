#pragma once
// What the Accelerator reports and what a trainer logs through it (a public header, no LibTorch):
// the model state a rank holds (memoryReport), a committed checkpoint (takeSaveReports), and the
// named values of initTrackers' config and log's scalars.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace cxxlaunch::runtime {

// Bytes of model state this rank holds now (Accelerator::memoryReport()).
struct MemoryReport {
  size_t parameters = 0;       // every parameter copy: compute copies and fp32 master shards
  size_t gradients = 0;        // full gradient buffers alive now, and gradient shards
  size_t optimizer_state = 0;  // moments / momentum buffers (nvme offload: the staging slots)
  size_t offloaded = 0;        // on disk (nvme offload), not in memory
  // In host memory, off the GPU (cpu offload: fp32 master and gradient shards, optimizer state);
  // not in total(), which counts the device's model state.
  size_t offloaded_to_cpu = 0;
  // The GPU's peak of allocated bytes (LibTorch's caching allocator: activations included), from
  // Accelerator::memoryReport on a GPU worker; 0 elsewhere.
  size_t device_peak = 0;
  // Freed buffers a step will allocate again, kept (ZeRO-3 on CPU); not
  // model state, so not in total().
  size_t kept_for_reuse = 0;
  size_t total() const { return parameters + gradients + optimizer_state; }
  std::string str() const;
};

// A config value as a trainer gives it: a number, a flag or text.
class ConfigValue {
 public:
  ConfigValue(const char* text) : text_(text) {}             // NOLINT: implicit, as a literal
  ConfigValue(std::string text) : text_(std::move(text)) {}  // NOLINT
  ConfigValue(bool flag) : text_(flag ? "true" : "false"), kind_(Kind::kFlag) {}          // NOLINT
  ConfigValue(int number) : ConfigValue(static_cast<long long>(number)) {}                // NOLINT
  ConfigValue(long number) : ConfigValue(static_cast<long long>(number)) {}               // NOLINT
  ConfigValue(long long number);                                                          // NOLINT
  ConfigValue(unsigned number) : ConfigValue(static_cast<unsigned long long>(number)) {}  // NOLINT
  ConfigValue(unsigned long number)                                                       // NOLINT
      : ConfigValue(static_cast<unsigned long long>(number)) {}
  ConfigValue(unsigned long long number);                                  // NOLINT
  ConfigValue(float number) : ConfigValue(static_cast<double>(number)) {}  // NOLINT
  ConfigValue(double number);                                              // NOLINT

  const std::string& text() const { return text_; }
  // The value as JSON: a number, true/false, or a string.
  std::string json() const;

 private:
  enum class Kind { kText, kNumber, kFlag };
  std::string text_;
  Kind kind_ = Kind::kText;
};

// Named values in the order given: a run's config, a log's scalars.
using RunConfig = std::vector<std::pair<std::string, ConfigValue>>;
using Scalars = std::vector<std::pair<std::string, double>>;

namespace checkpoint {

// A committed save: its directory, the bytes of its rank files over every rank, the seconds
// from its start to its commit, and of those the seconds training waited for it.
struct SaveReport {
  std::string dir;
  uint64_t bytes = 0;
  double seconds = 0;
  double blocked_seconds = 0;
};

}  // namespace checkpoint

}  // namespace cxxlaunch::runtime
