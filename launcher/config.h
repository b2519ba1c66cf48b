#pragma once
// The training configuration: accelerate's YAML schema (LOCAL_MACHINE) plus cxxlaunch's own
// `cxxlaunch:` section, as one flat table of dotted keys ("deepspeed_config.zero_stage").
// Every value is resolved in layers, flag > CXXLAUNCH_* environment > file > default, and keeps
// where it came from so that `cxxlaunch config --print` and every error can name it.
//
// The schema table drives everything else: the loader, the writer, the `cxxlaunch run` flags,
// the environment layer and docs/config.md. Plain data and free functions; no I/O except
// loadConfigFile/writeConfigFile. Errors are ConfigError (an InvalidArgument: exit code 2) whose
// message starts with the place at fault: FILE:LINE:COLUMN, --flag or the variable's name.
//
// One job per file: the schema in config_schema.cc, value parsing in config_value.cc, reading
// YAML in config_reader.cc, writing it in config_writer.cc, layering in config_layers.cc, the
// checks across keys in config_validation.cc, the worker environment in worker_env.cc, the
// --print table in config_print.cc (their shared helpers: config_internal.h).

#include <map>
#include <string>
#include <vector>

#include "common/error.h"

namespace cxxlaunch::launcher {

class ConfigError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

enum class KeyType {
  kBool,     // true/false (also yes/no, on/off, as YAML 1.1)
  kInt,      // a whole number within [min, max]
  kNumber,   // a real number within [min, max]
  kSeconds,  // a real number of seconds within [min, max]
  kChoice,   // one of `choices`, matched ignoring case, stored in the schema's spelling
  kText,     // any string
  kGpuIds,   // "all" or a comma-separated list of device ids
};

struct KeySpec {
  std::string key;  // dotted path in the file
  KeyType type = KeyType::kText;
  std::vector<std::string> choices;
  double min = 0, max = 0;
  std::string default_value;  // empty: no default (unset)
  std::string flag;           // the `cxxlaunch run` flag that sets it (under_score form); or empty
  std::string env;            // the CXXLAUNCH_* variable that sets it
  std::string help;
};

// Parses `text` as `spec`'s type: true with its canonical text in `value`, or false with a
// one-line reason in `why` ("'abc' is not a whole number from 1 to 65536").
bool parseValue(const KeySpec& spec, const std::string& text, std::string& value, std::string& why);

// The schema in file order; the writer, the wizard and docs/config.md follow it.
const std::vector<KeySpec>& configSchema();
const KeySpec* findKey(const std::string& key);

// Where a value came from.
struct Origin {
  enum Kind { kDefault, kFile, kEnv, kFlag };
  Kind kind = kDefault;
  std::string where;  // FILE:LINE:COLUMN, the variable's name, or --flag

  std::string describe() const;  // "default", "file a.yaml:3:5", "env CXXLAUNCH_X", "flag --x"
};

struct Setting {
  std::string value;  // canonical text: "true", "2", "bf16", "0.5"
  Origin origin;
  bool operator==(const Setting& other) const { return value == other.value; }
};

class Config {
 public:
  // Parses `text` as the key's type and stores its canonical form; throws ConfigError naming
  // `origin` when the key is unknown or the text does not fit.
  void set(const std::string& key, const std::string& text, const Origin& origin);
  void unset(const std::string& key) { values_.erase(key); }

  bool isSet(const std::string& key) const { return values_.count(key) != 0; }
  // The resolved value: the set one, else the schema's default ("" when it has none).
  std::string text(const std::string& key) const;
  long long integer(const std::string& key) const;
  double number(const std::string& key) const;
  bool flag(const std::string& key) const;
  Origin origin(const std::string& key) const;

  const std::map<std::string, Setting>& values() const { return values_; }

  // Keys of accelerate's that cxxlaunch accepts without using (TPU, SageMaker, dynamo, ...):
  // dotted key -> the value as flow-style YAML, kept so that writing the file loses nothing.
  std::map<std::string, std::string> ignored;
  // One line per ignored key or adjusted value, with its position, for the user to read.
  std::vector<std::string> notes;

  bool operator==(const Config& other) const {
    return values_ == other.values_ && ignored == other.ignored;
  }

 private:
  std::map<std::string, Setting> values_;
};

// Reads YAML text; `name` is the file name used in messages. Checks syntax, types, unknown keys
// (with the closest known one) and value ranges, not combinations (see validateConfig).
Config parseConfigText(const std::string& text, const std::string& name);
// Reads and parses `path`, which must be a regular file of at most kMaxConfigFileBytes: anything
// else (a directory, FIFO, device, a huge file) is a ConfigError before a byte is read.
inline constexpr size_t kMaxConfigFileBytes = 4 << 20;
Config loadConfigFile(const std::string& path);

// The YAML for every set value and every ignored key, nested as accelerate writes it; reading
// it back gives an equal Config.
std::string writeConfigText(const Config& config);
// Writes atomically (temporary file, rename). Refuses to replace an existing file unless
// `overwrite`.
void writeConfigFile(const Config& config, const std::string& path, bool overwrite);

// $XDG_CACHE_HOME/cxxlaunch/default_config.yaml, else ~/.cache/cxxlaunch/default_config.yaml.
std::string defaultConfigPath();

// The CXXLAUNCH_* variables of this process's environment.
std::map<std::string, std::string> configEnvironment();

struct FlagValue {
  std::string key;
  std::string value;
  std::string flag;  // as the user spelled it, for messages
};

// The layers in precedence order, lowest first after the defaults.
struct ConfigLayers {
  std::string file;  // empty: no file
  // What Slurm or MPI say (launcher/cluster_env.h): over the file, under the env; each
  // FlagValue::flag names its variable.
  std::vector<FlagValue> cluster;
  std::map<std::string, std::string> env;  // variable -> value
  std::vector<FlagValue> flags;
};

// file, then the cluster's variables, then env, then flags; the file's deepspeed_config or
// fsdp_config set aside (Config::ignored, a note) when distributed_type is not theirs, as
// accelerate ignores them; then validateConfig.
Config resolveConfig(const ConfigLayers& layers);
// Reads the DeepSpeed JSON that deepspeed_config.deepspeed_config_file names, if set and
// distributed_type is DEEPSPEED (else a note), into the keys it corresponds to
// (deepspeed_config_file.cc); resolveConfig calls it after the layers.
void applyDeepSpeedConfigFile(Config& config);

// Impossible combinations (fp16 on CPU, num_processes not divisible by num_machines, ...):
// throws ConfigError naming the setting at fault.
void validateConfig(const Config& config);
// What validateConfig cannot know from the file alone: whether this machine, with `gpus` GPUs
// visible (HostInfo::gpus), can run it. Without a GPU the workers train on CPUs whatever
// use_cpu says, so fp16 (which needs one) is a ConfigError here, before any worker starts.
void validateConfigOnMachine(const Config& config, int gpus);

// The training settings the workers read (common/env_names.h, "training settings"), derived
// from the config. A CXXLAUNCH_* variable of that name in `env` wins over a value derived from
// the file, not over one derived from a flag.
std::map<std::string, std::string> workerSettings(const Config& config,
                                                  const std::map<std::string, std::string>& env);

// The `cxxlaunch config --print` table: every key, its value and its source, then the worker
// settings.
std::string describeConfig(const Config& config, const std::map<std::string, std::string>& env);

}  // namespace cxxlaunch::launcher
