// Layering: a Config holds each value with where it came from; resolveConfig applies file, then
// the cluster's own variables (Slurm, MPI), then CXXLAUNCH_* environment, then flags, and
// validates the result.

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <set>
#include <utility>
#include <vector>

#include "launcher/config.h"
#include "launcher/config_internal.h"

extern char** environ;  // NOLINT(readability-redundant-declaration)

namespace cxxlaunch::launcher {

using namespace config_detail;  // NOLINT(google-build-using-namespace)

std::string config_detail::originName(const Origin& origin) {
  return origin.where.empty() ? "the default" : origin.where;
}

std::string Origin::describe() const {
  switch (kind) {
    case kDefault:
      return "default";
    case kFile:
      return "file " + where;
    case kEnv:
      return "env " + where;
    case kFlag:
      return "flag " + where;
  }
  return where;
}

void Config::set(const std::string& key, const std::string& text, const Origin& origin) {
  const KeySpec* spec = findKey(key);
  if (spec == nullptr) throw ConfigError(originName(origin) + ": unknown key '" + key + "'");
  std::string value, why;
  if (!parseValue(*spec, text, value, why)) {
    throw ConfigError(originName(origin) + ": " + key + ": " + why);
  }
  values_[key] = Setting{std::move(value), origin};
}

std::string Config::text(const std::string& key) const {
  if (auto it = values_.find(key); it != values_.end()) return it->second.value;
  const KeySpec* spec = findKey(key);
  return spec != nullptr ? spec->default_value : "";
}

long long Config::integer(const std::string& key) const {
  const std::string t = text(key);
  return t.empty() ? 0 : std::stoll(t);
}

double Config::number(const std::string& key) const {
  const std::string t = text(key);
  return t.empty() ? 0 : std::strtod(t.c_str(), nullptr);
}

bool Config::flag(const std::string& key) const { return text(key) == "true"; }

Origin Config::origin(const std::string& key) const {
  if (auto it = values_.find(key); it != values_.end()) return it->second.origin;
  return {};
}

std::map<std::string, std::string> configEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry(*e);
    if (!entry.starts_with("CXXLAUNCH_")) continue;
    const auto eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return env;
}

namespace {

// accelerate reads a file's deepspeed_config only for DEEPSPEED and its fsdp_config only for FSDP
// (its tests/test_configs/validate_launch_cmd.yaml names a DeepSpeed file that does not exist
// under distributed_type NO). So does cxxlaunch: the file's keys of a section not in use are set
// aside as accelerate's keys it does not use are (kept when the file is written again), with one
// note per section. Flags and variables are the user's word for this run and stay, and so do
// the two keys accelerate keeps under deepspeed_config that apply to every strategy here.
void setAsideUnusedSections(Config& config) {
  const std::set<std::string> every_strategy = {"deepspeed_config.gradient_accumulation_steps",
                                                "deepspeed_config.gradient_clipping"};
  const std::string type = config.text("distributed_type");
  for (const auto& [section, owner] :
       {std::pair<std::string, std::string>{"deepspeed_config", "DEEPSPEED"},
        {"fsdp_config", "FSDP"}}) {
    if (type == owner) continue;
    std::vector<std::string> keys;
    for (const auto& [key, setting] : config.values()) {
      if (setting.origin.kind == Origin::kFile && key.starts_with(section + ".") &&
          every_strategy.count(key) == 0) {
        keys.push_back(key);
      }
    }
    if (keys.empty()) continue;
    std::string names;
    for (const std::string& key : keys) {
      YAML::Emitter out;
      out << config.text(key);
      config.ignored[key] = out.c_str();
      names += (names.empty() ? "" : ", ") + key.substr(section.size() + 1);
    }
    config.notes.push_back(config.origin(keys.front()).where + ": " + section + " (" + names +
                           ") is for distributed_type " + owner + ", and this config's is " + type +
                           " (" + originName(config.origin("distributed_type")) +
                           "); ignored, as accelerate does");
    for (const std::string& key : keys) config.unset(key);
  }
}

}  // namespace

Config resolveConfig(const ConfigLayers& layers) {
  Config config;
  if (!layers.file.empty()) config = loadConfigFile(layers.file);
  for (const auto& c : layers.cluster) config.set(c.key, c.value, {Origin::kEnv, c.flag});
  for (const auto& spec : configSchema()) {
    if (spec.env.empty()) continue;
    if (auto it = layers.env.find(spec.env); it != layers.env.end()) {
      config.set(spec.key, it->second, {Origin::kEnv, spec.env});
    }
  }
  for (const auto& f : layers.flags) config.set(f.key, f.value, {Origin::kFlag, f.flag});
  setAsideUnusedSections(config);
  applyDeepSpeedConfigFile(config);
  validateConfig(config);
  return config;
}

}  // namespace cxxlaunch::launcher
