// Writing a config file as accelerate nests it (strings quoted for PyYAML), atomically; and where
// the default file lives.

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <functional>

#include "common/atomic_file.h"
#include "launcher/config.h"
#include "launcher/config_internal.h"

namespace cxxlaunch::launcher {

using namespace config_detail;  // NOLINT(google-build-using-namespace)

namespace {

namespace fs = std::filesystem;

}  // namespace

std::string writeConfigText(const Config& config) {
  // Nested as accelerate writes it: sections in schema order, ignored keys last.
  YAML::Node root(YAML::NodeType::Map);
  auto place = [&](const std::string& key, const YAML::Node& value) {
    const auto dot = key.find('.');
    if (dot == std::string::npos) {
      root[key] = value;
    } else {
      root[key.substr(0, dot)][key.substr(dot + 1)] = value;
    }
  };
  for (const auto& spec : configSchema()) {
    if (config.isSet(spec.key)) place(spec.key, YAML::Node(config.text(spec.key)));
  }
  for (const auto& [key, text] : config.ignored) place(key, YAML::Load(text));
  // Strings are double-quoted so that PyYAML (YAML 1.1) does not read NO as false or an address
  // as a number; yaml-cpp quotes per value only through the emitter, hence the walk.
  YAML::Emitter out;
  std::function<void(const YAML::Node&, const std::string&)> emit = [&](const YAML::Node& node,
                                                                        const std::string& path) {
    if (config.ignored.count(path) != 0) {
      out << node;
      return;
    }
    if (node.IsMap()) {
      out << YAML::BeginMap;
      for (const auto& entry : node) {
        const std::string key = entry.first.Scalar();
        out << YAML::Key << key << YAML::Value;
        emit(entry.second, path.empty() ? key : path + "." + key);
      }
      out << YAML::EndMap;
      return;
    }
    const KeySpec* spec = findKey(path);
    if (spec != nullptr && (spec->type == KeyType::kChoice || spec->type == KeyType::kText ||
                            spec->type == KeyType::kGpuIds)) {
      out << YAML::DoubleQuoted;
    }
    out << node.Scalar();
  };
  emit(root, "");
  return std::string(out.c_str()) + "\n";
}

void writeConfigFile(const Config& config, const std::string& path, bool overwrite) {
  std::error_code ec;
  if (!overwrite && fs::exists(path, ec)) {
    throw ConfigError(path +
                      " already exists; pass --force to replace it, or --config_file "
                      "to write elsewhere");
  }
  const fs::path target(path);
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  try {
    writeFileAtomically(path, writeConfigText(config));
  } catch (const SystemError& e) {
    throw ConfigError(path + ": cannot write the config file: " + e.what());
  }
}

std::string defaultConfigPath() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");  // NOLINT(concurrency-mt-unsafe)
  fs::path base;
  if (xdg != nullptr && *xdg != '\0') {
    base = xdg;
  } else {
    const char* home = std::getenv("HOME");  // NOLINT(concurrency-mt-unsafe)
    base = fs::path(home != nullptr ? home : "/") / ".cache";
  }
  return (base / "cxxlaunch" / "default_config.yaml").string();
}

}  // namespace cxxlaunch::launcher
