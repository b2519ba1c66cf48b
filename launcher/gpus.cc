#include "launcher/gpus.h"

#include "launcher/cli.h"

namespace cxxlaunch::launcher {

std::string visibleDevices(const std::vector<int>& gpus, const char* inherited) {
  std::vector<std::string> devices;  // what the ids count within; empty: the machine's own
  if (inherited != nullptr) {
    std::string list(inherited);
    for (size_t begin = 0; begin <= list.size();) {
      size_t end = list.find(',', begin);
      if (end == std::string::npos) end = list.size();
      if (end > begin) devices.push_back(list.substr(begin, end - begin));
      begin = end + 1;
    }
  }
  std::string visible;
  for (int id : gpus) {
    if (inherited != nullptr && (id < 0 || static_cast<size_t>(id) >= devices.size())) {
      throw UsageError("--gpus " + std::to_string(id) + ": this shell's CUDA_VISIBLE_DEVICES=" +
                       inherited + " shows " + std::to_string(devices.size()) +
                       " GPU(s), and --gpus counts within it (0 to " +
                       std::to_string(static_cast<int>(devices.size()) - 1) +
                       "); unset it to name the machine's GPUs directly");
    }
    if (!visible.empty()) visible += ",";
    visible += inherited != nullptr ? devices[static_cast<size_t>(id)] : std::to_string(id);
  }
  return visible;
}

}  // namespace cxxlaunch::launcher
