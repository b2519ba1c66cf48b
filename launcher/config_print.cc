// The `cxxlaunch config --print` table: each setting, its value and its source, then the worker
// environment.

#include <algorithm>
#include <sstream>

#include "launcher/config.h"
#include "launcher/config_internal.h"

namespace cxxlaunch::launcher {

using namespace config_detail;  // NOLINT(google-build-using-namespace)

std::string describeConfig(const Config& c, const std::map<std::string, std::string>& env) {
  std::ostringstream out;
  size_t width = 0;
  for (const auto& spec : configSchema()) width = std::max(width, spec.key.size());
  out << "  setting" << std::string(width - 5, ' ') << "value  (source)\n";
  for (const auto& spec : configSchema()) {
    std::string value = c.text(spec.key);
    if (value.empty()) value = "(unset)";
    out << "  " << spec.key << std::string(width + 2 - spec.key.size(), ' ') << value << "  ("
        << c.origin(spec.key).describe() << ")\n";
  }
  for (const auto& [key, text] : c.ignored) out << "  " << key << ": ignored\n";
  out << "\nworker environment:\n";
  for (const auto& [name, value] : workerSettings(c, env))
    out << "  " << name << "=" << value << "\n";
  return out.str();
}

}  // namespace cxxlaunch::launcher
