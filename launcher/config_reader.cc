// Reading a config file: YAML syntax, nesting, unknown keys (with the closest known one),
// accelerate's ignored and legacy keys; each value parsed as its key's type at its line and column.

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>

#include "common/did_you_mean.h"
#include "common/file.h"
#include "launcher/config.h"
#include "launcher/config_internal.h"
#include "launcher/doc_reference.h"

namespace cxxlaunch::launcher {

using namespace config_detail;  // NOLINT(google-build-using-namespace)

namespace {

std::string position(const std::string& name, const YAML::Mark& mark) {
  if (mark.is_null()) return name;
  return name + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

std::vector<std::string> knownKeysUnder(const std::string& prefix) {
  std::vector<std::string> keys;
  auto add = [&](const std::string& full) {
    if (!full.starts_with(prefix)) return;
    std::string rest = full.substr(prefix.size());
    rest = rest.substr(0, rest.find('.'));
    if (std::find(keys.begin(), keys.end(), rest) == keys.end()) keys.push_back(rest);
  };
  for (const auto& spec : configSchema()) add(spec.key);
  for (const auto& key : ignoredKeys()) add(key);
  return keys;
}

class Loader {
 public:
  Loader(Config& config, std::string name) : config_(config), name_(std::move(name)) {}

  // Throws one ConfigError naming every unknown key met, with the closest known key of each.
  void reportUnknownKeys() const {
    if (unknown_.empty()) return;
    const Unknown& first = unknown_.front();
    if (unknown_.size() == 1) {
      throw ConfigError(position(name_, first.mark) + ": unknown key '" + first.key + "'" +
                        (first.best.empty() ? "" : "; did you mean " + first.best + "?") +
                        " (see " + docReference("config.md") + ")");
    }
    std::string message =
        position(name_, first.mark) + ": " + std::to_string(unknown_.size()) + " unknown keys: ";
    for (size_t i = 0; i < unknown_.size(); ++i) {
      const Unknown& u = unknown_[i];
      message += (i == 0 ? "'" : ", '") + u.key + "' (line " + std::to_string(u.mark.line + 1) +
                 (u.best.empty() ? "" : "; did you mean " + u.best + "?") + ")";
    }
    throw ConfigError(message + " (see " + docReference("config.md") + ")");
  }

  void loadMap(const YAML::Node& map, const std::string& prefix) {
    for (const auto& entry : map) {
      const YAML::Node key_node = entry.first;
      const YAML::Node value = entry.second;
      if (!key_node.IsScalar()) {
        throw ConfigError(position(name_, key_node.Mark()) + ": a key must be a plain name");
      }
      const std::string key = prefix + key_node.Scalar();
      const YAML::Mark value_mark = value.Mark().is_null() ? key_node.Mark() : value.Mark();
      if (ignoredKeys().count(key) != 0) {
        YAML::Emitter out;
        out.SetMapFormat(YAML::Flow);
        out.SetSeqFormat(YAML::Flow);
        out << value;
        config_.ignored[key] = out.c_str();
        config_.notes.push_back(position(name_, key_node.Mark()) + ": " + key +
                                " is accelerate's and does not apply to cxxlaunch; ignored");
        continue;
      }
      if (prefix.empty() && std::find(kSections.begin(), kSections.end(), key) != kSections.end()) {
        if (value.IsNull()) continue;  // `fsdp_config:` with nothing under it
        if (!value.IsMap()) {
          throw ConfigError(position(name_, value_mark) + ": " + key +
                            " must be a mapping of keys (or {})");
        }
        loadMap(value, key + ".");
        continue;
      }
      if (prefix.empty() && key == "fp16") {  // accelerate's legacy spelling
        if (value.IsScalar() && lower(value.Scalar()) == "true" &&
            !config_.isSet("mixed_precision")) {
          config_.set("mixed_precision", "fp16", {Origin::kFile, position(name_, value_mark)});
        }
        config_.notes.push_back(position(name_, key_node.Mark()) +
                                ": fp16 is accelerate's old spelling; read as mixed_precision");
        continue;
      }
      const KeySpec* spec = findKey(key);
      if (spec == nullptr) {
        // Collected, not thrown: a file with several is fixed in one go, as accelerate's.
        const std::string best = closestMatch(key_node.Scalar(), knownKeysUnder(prefix));
        unknown_.push_back({key_node.Mark(), key, best.empty() ? "" : prefix + best});
        continue;
      }
      if (value.IsNull()) continue;  // accelerate writes None as null: unset
      if (!value.IsScalar()) {
        throw ConfigError(position(name_, value_mark) + ": " + key + " must be " + kindName(*spec) +
                          ", not a " + (value.IsMap() ? "mapping" : "list"));
      }
      config_.set(key, value.Scalar(), {Origin::kFile, position(name_, value_mark)});
    }
  }

 private:
  struct Unknown {
    YAML::Mark mark;
    std::string key, best;  // best: the closest known key, or ""
  };
  Config& config_;
  std::string name_;
  std::vector<Unknown> unknown_;
};

}  // namespace

Config parseConfigText(const std::string& text, const std::string& name) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::DeepRecursion& e) {
    throw ConfigError(position(name, e.mark) + ": the YAML nests too deeply to be a config file");
  } catch (const YAML::Exception& e) {
    throw ConfigError(position(name, e.mark) + ": YAML syntax error: " + e.msg +
                      "; fix the file or write a new one with `cxxlaunch config`");
  }
  Config config;
  if (root.IsNull()) return config;
  if (!root.IsMap()) {
    throw ConfigError(
        position(name, root.Mark()) +
        ": a config file is a mapping of keys, such as `distributed_type: MULTI_GPU`");
  }
  try {
    Loader loader(config, name);
    loader.loadMap(root, "");
    loader.reportUnknownKeys();
  } catch (const YAML::Exception& e) {
    throw ConfigError(position(name, e.mark) + ": " + e.msg);
  }
  return config;
}

Config loadConfigFile(const std::string& path) {
  std::string text;
  try {
    // Regular files only, and small ones: a directory must not pass as an empty config, a FIFO
    // must not hang the launch, /dev/zero must not fill memory.
    text = readRegularFile(path, "config file", kMaxConfigFileBytes);
  } catch (const InvalidArgument& e) {
    throw ConfigError(std::string(e.what()) +
                      "; check the path or write one with `cxxlaunch config`");
  }
  return parseConfigText(text, path);
}

}  // namespace cxxlaunch::launcher
