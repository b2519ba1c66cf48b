// libFuzzer target for the config loader: any bytes either load or fail with ConfigError, never
// crash, hang or leak; what loads also validates, describes itself and round-trips through the
// writer unchanged.

#include <cstdint>
#include <cstdlib>
#include <string>

#include "launcher/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cxxlaunch::launcher;
  const std::string text(reinterpret_cast<const char*>(data), size);
  Config config;
  try {
    config = parseConfigText(text, "fuzz.yaml");
  } catch (const ConfigError&) {
    return 0;
  }
  try {
    validateConfig(config);
  } catch (const ConfigError&) {
  }
  (void)describeConfig(config, {});
  const std::string written = writeConfigText(config);
  if (!(parseConfigText(written, "written.yaml") == config)) std::abort();
  return 0;
}
