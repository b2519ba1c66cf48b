#include "launcher/config.h"

#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string_view>

#include "rendezvous/file.h"
#include "runtime/env_names.h"

extern char** environ;  // NOLINT(readability-redundant-declaration)

namespace cxxlaunch::launcher {
namespace {

namespace fs = std::filesystem;

KeySpec boolKey(std::string key, std::string def, std::string flag, std::string env,
                std::string help) {
  KeySpec s;
  s.key = std::move(key);
  s.type = KeyType::kBool;
  s.default_value = std::move(def);
  s.flag = std::move(flag);
  s.env = std::move(env);
  s.help = std::move(help);
  return s;
}

KeySpec rangeKey(std::string key, KeyType type, double min, double max, std::string def,
                 std::string flag, std::string env, std::string help) {
  KeySpec s =
      boolKey(std::move(key), std::move(def), std::move(flag), std::move(env), std::move(help));
  s.type = type;
  s.min = min;
  s.max = max;
  return s;
}

KeySpec choiceKey(std::string key, std::vector<std::string> choices, std::string def,
                  std::string flag, std::string env, std::string help) {
  KeySpec s =
      boolKey(std::move(key), std::move(def), std::move(flag), std::move(env), std::move(help));
  s.type = KeyType::kChoice;
  s.choices = std::move(choices);
  return s;
}

KeySpec textKey(std::string key, KeyType type, std::string def, std::string flag, std::string env,
                std::string help) {
  KeySpec s =
      boolKey(std::move(key), std::move(def), std::move(flag), std::move(env), std::move(help));
  s.type = type;
  return s;
}

const std::vector<std::string> kShardingStrategies = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD",
                                                      "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"};

std::vector<KeySpec> buildSchema() {
  using K = KeyType;
  const double kYear = 86400 * 365;  // the bound of every time setting
  // The rendezvous times the daemon accepts (rendezvous::kMaxSettingTime): refused here, at the
  // line that sets them, rather than by the server after the launch.
  const double kRendezvousTime = 86400;
  return {
      choiceKey("compute_environment", {"LOCAL_MACHINE", "AMAZON_SAGEMAKER"}, "LOCAL_MACHINE", "",
                "", "where the job runs; cxxlaunch runs on this machine only"),
      choiceKey("distributed_type", {"NO", "MULTI_CPU", "MULTI_GPU", "FSDP", "DEEPSPEED"}, "NO", "",
                "CXXLAUNCH_DISTRIBUTED_TYPE",
                "NO and MULTI_* train with DDP; FSDP and DEEPSPEED shard (--multi_gpu, "
                "--use_fsdp, --use_deepspeed)"),
      choiceKey("mixed_precision", {"no", "fp16", "bf16", "fp8"}, "no", "mixed_precision",
                "CXXLAUNCH_MIXED_PRECISION", "compute precision; fp8 runs as bf16"),
      boolKey("use_cpu", "false", "use_cpu", "CXXLAUNCH_USE_CPU",
              "train on CPUs even when GPUs are present (also --cpu)"),
      boolKey("debug", "false", "debug", "CXXLAUNCH_DEBUG",
              "check collectives' shapes across ranks (slower; catches hangs)"),
      rangeKey("num_machines", K::kInt, 1, 65536, "1", "num_machines", "CXXLAUNCH_NUM_MACHINES",
               "nodes in the job (--nnodes)"),
      rangeKey("num_processes", K::kInt, 1, 1 << 24, "", "num_processes", "CXXLAUNCH_NUM_PROCESSES",
               "workers in the whole job, across machines; per node: num_processes / "
               "num_machines (unset: --nproc_per_node, default 1)"),
      rangeKey("machine_rank", K::kInt, 0, 65535, "0", "machine_rank", "CXXLAUNCH_MACHINE_RANK",
               "this machine's rank, 0 on the main one (--node_rank)"),
      textKey("main_process_ip", K::kText, "", "main_process_ip", "CXXLAUNCH_MAIN_PROCESS_IP",
              "the main machine's address; with num_machines > 1 the rendezvous endpoint"),
      rangeKey("main_process_port", K::kInt, 0, 65535, "29500", "main_process_port",
               "CXXLAUNCH_MAIN_PROCESS_PORT", "the rendezvous port on the main machine"),
      choiceKey("rdzv_backend", {"static", "c10d"}, "static", "", "CXXLAUNCH_RDZV_BACKEND",
                "static: ranks by machine_rank; c10d: by arrival (--rdzv_backend)"),
      boolKey("same_network", "true", "same_network", "CXXLAUNCH_SAME_NETWORK",
              "accepted; cxxlaunch always meets at main_process_ip:main_process_port"),
      textKey("gpu_ids", K::kGpuIds, "all", "gpu_ids", "CXXLAUNCH_GPU_IDS",
              "GPUs on this machine, e.g. 0,1, or all (--gpus)"),
      rangeKey("deepspeed_config.zero_stage", K::kInt, 0, 3, "2", "zero_stage",
               "CXXLAUNCH_ZERO_STAGE", "DEEPSPEED only: 0 (DDP), 1, 2 or 3"),
      choiceKey("deepspeed_config.offload_optimizer_device", {"none", "cpu", "nvme"}, "none",
                "offload_optimizer_device", "CXXLAUNCH_OFFLOAD_OPTIMIZER_DEVICE",
                "DEEPSPEED only: keep optimizer state on the CPU, or on local disk (nvme)"),
      choiceKey("deepspeed_config.offload_param_device", {"none", "cpu", "nvme"}, "none",
                "offload_param_device", "CXXLAUNCH_OFFLOAD_PARAM_DEVICE",
                "DEEPSPEED stage 3 only: keep parameters on the CPU, or on local disk (nvme)"),
      textKey("deepspeed_config.offload_optimizer_nvme_path", K::kText, "",
              "offload_optimizer_nvme_path", "CXXLAUNCH_OFFLOAD_OPTIMIZER_NVME_PATH",
              "offload_optimizer_device nvme: a directory on local disk for the swap file"),
      textKey("deepspeed_config.offload_param_nvme_path", K::kText, "",
              "offload_param_nvme_path", "CXXLAUNCH_OFFLOAD_PARAM_NVME_PATH",
              "offload_param_device nvme: a directory on local disk for the swap file"),
      rangeKey("deepspeed_config.gradient_accumulation_steps", K::kInt, 1, 1 << 20, "1",
               "gradient_accumulation_steps", "CXXLAUNCH_GRADIENT_ACCUMULATION_STEPS",
               "micro-batches per optimizer step, for every strategy"),
      rangeKey("deepspeed_config.gradient_clipping", K::kNumber, 0, 1e30, "0", "gradient_clipping",
               "CXXLAUNCH_GRADIENT_CLIPPING", "max gradient norm, for every strategy; 0: none"),
      boolKey("deepspeed_config.zero3_save_16bit_model", "false", "zero3_save_16bit_model",
              "CXXLAUNCH_ZERO3_SAVE_16BIT_MODEL", "ZeRO-3: save a gathered 16-bit model"),
      boolKey("deepspeed_config.zero3_init_flag", "false", "zero3_init_flag",
              "CXXLAUNCH_ZERO3_INIT_FLAG", "ZeRO-3: build the model already sharded"),
      choiceKey("fsdp_config.fsdp_sharding_strategy", kShardingStrategies, "FULL_SHARD",
                "fsdp_sharding_strategy", "CXXLAUNCH_FSDP_SHARDING_STRATEGY",
                "FSDP only (1-5 also accepted, accelerate's old numbering)"),
      choiceKey("fsdp_config.fsdp_reshard_after_forward",
                {"true", "false", "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                 "HYBRID_SHARD_ZERO2"},
                "", "fsdp_reshard_after_forward", "CXXLAUNCH_FSDP_RESHARD_AFTER_FORWARD",
                "FSDP2's spelling: true = FULL_SHARD, false = SHARD_GRAD_OP"),
      boolKey("fsdp_config.fsdp_offload_params", "false", "fsdp_offload_params",
              "CXXLAUNCH_FSDP_OFFLOAD_PARAMS", "FSDP: keep parameters and gradients on the CPU"),
      choiceKey("fsdp_config.fsdp_auto_wrap_policy",
                {"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"}, "NO_WRAP",
                "fsdp_auto_wrap_policy", "CXXLAUNCH_FSDP_AUTO_WRAP_POLICY",
                "FSDP: which modules become shard units (besides acc.wrap)"),
      textKey("fsdp_config.fsdp_transformer_layer_cls_to_wrap", K::kText, "",
              "fsdp_transformer_layer_cls_to_wrap", "CXXLAUNCH_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP",
              "FSDP: module names wrapped by TRANSFORMER_BASED_WRAP, comma-separated"),
      rangeKey("fsdp_config.fsdp_min_num_params", K::kInt, 0, 1e15, "100000000",
               "fsdp_min_num_params", "CXXLAUNCH_FSDP_MIN_NUM_PARAMS",
               "FSDP: parameters per unit for SIZE_BASED_WRAP"),
      choiceKey("fsdp_config.fsdp_backward_prefetch",
                {"BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"}, "BACKWARD_PRE",
                "fsdp_backward_prefetch", "CXXLAUNCH_FSDP_BACKWARD_PREFETCH",
                "FSDP: when the next unit's parameters are gathered in backward"),
      boolKey("fsdp_config.fsdp_forward_prefetch", "false", "fsdp_forward_prefetch",
              "CXXLAUNCH_FSDP_FORWARD_PREFETCH", "FSDP: gather the next unit during forward"),
      choiceKey("fsdp_config.fsdp_state_dict_type",
                {"FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"}, "FULL_STATE_DICT",
                "fsdp_state_dict_type", "CXXLAUNCH_FSDP_STATE_DICT_TYPE",
                "FSDP: checkpoints gathered on rank 0 (FULL) or one shard per rank"),
      boolKey("fsdp_config.fsdp_sync_module_states", "true", "fsdp_sync_module_states",
              "CXXLAUNCH_FSDP_SYNC_MODULE_STATES", "FSDP: broadcast rank 0's initial weights"),
      boolKey("fsdp_config.fsdp_activation_checkpointing", "false", "fsdp_activation_checkpointing",
              "CXXLAUNCH_FSDP_ACTIVATION_CHECKPOINTING", "FSDP: recompute activations in backward"),
      rangeKey("cxxlaunch.join_timeout", K::kSeconds, 0.001, kYear, "600", "",
               "CXXLAUNCH_JOIN_TIMEOUT", "seconds to wait for all nodes (--rdzv_conf)"),
      rangeKey("cxxlaunch.last_call_timeout", K::kSeconds, 0, kRendezvousTime, "30", "",
               "CXXLAUNCH_LAST_CALL_TIMEOUT", "seconds an elastic round waits for latecomers"),
      rangeKey("cxxlaunch.close_timeout", K::kSeconds, 0, kYear, "300", "",
               "CXXLAUNCH_CLOSE_TIMEOUT", "seconds the exit barrier waits"),
      rangeKey("cxxlaunch.keep_alive_interval", K::kSeconds, 0.001, kRendezvousTime, "5", "",
               "CXXLAUNCH_KEEP_ALIVE_INTERVAL", "seconds between node heartbeats"),
      rangeKey("cxxlaunch.keep_alive_max_misses", K::kInt, 1, 1000, "3", "",
               "CXXLAUNCH_KEEP_ALIVE_MAX_MISSES", "missed heartbeats before a node is lost"),
      rangeKey("cxxlaunch.shutdown_grace", K::kSeconds, 0, kYear, "30", "",
               "CXXLAUNCH_SHUTDOWN_GRACE", "SIGTERM to SIGKILL grace (--shutdown_grace)"),
      rangeKey("cxxlaunch.max_restarts", K::kInt, 0, 1e6, "0", "", "CXXLAUNCH_MAX_RESTARTS",
               "restarts of the worker group (--max_restarts)"),
      textKey("cxxlaunch.checkpoint_dir", K::kText, "", "checkpoint_dir",
              "CXXLAUNCH_CHECKPOINT_DIR",
              "folder the workers save checkpoints into and resume from after a restart"),
      textKey("cxxlaunch.log_dir", K::kText, "", "", "CXXLAUNCH_LOG_DIR",
              "per-rank logs (--log_dir; unset: $TMPDIR/cxxlaunch)"),
      textKey("cxxlaunch.token_file", K::kText, "", "", "CXXLAUNCH_TOKEN_FILE",
              "file holding the job token (--rdzv_conf token_file=)"),
      textKey("cxxlaunch.rdzv_endpoint", K::kText, "", "", "CXXLAUNCH_RDZV_ENDPOINT",
              "HOST:PORT of the rendezvous; overrides main_process_ip/port (--rdzv_endpoint)"),
      textKey("cxxlaunch.rdzv_id", K::kText, "", "", "CXXLAUNCH_RDZV_ID",
              "job id, the same on every node (--rdzv_id; unset: from main_process_ip/port)"),
  };
}

// accelerate's keys that mean nothing to a C++ launcher. Any value is accepted and reported.
const std::set<std::string>& ignoredKeys() {
  static const std::set<std::string> keys = {
      // whole sections
      "dynamo_config", "fp8_config", "megatron_lm_config", "mpirun_config", "parallelism_config",
      "ipex_config", "tpu_env",
      // TPU, notebooks, SageMaker, CPU affinity, legacy
      "main_training_function", "downcast_bf16", "enable_cpu_affinity", "tpu_name", "tpu_zone",
      "tpu_use_cluster", "tpu_use_sudo", "tpu_vm", "command_file", "commands", "use_mps_device",
      "dynamo_backend", "ec2_instance_type", "iam_role_name", "image_uri", "profile", "region",
      "base_job_name", "pytorch_version", "transformers_version", "py_version",
      "sagemaker_inputs_file", "sagemaker_metrics_file", "additional_args",
      "num_cpu_threads_per_process", "deepspeed_config.deepspeed_config_file",
      "deepspeed_config.deepspeed_moe_layer_cls_names",
      "deepspeed_config.deepspeed_multinode_launcher", "deepspeed_config.deepspeed_hostfile",
      "deepspeed_config.deepspeed_inclusion_filter", "deepspeed_config.deepspeed_exclusion_filter",
      "fsdp_config.fsdp_version", "fsdp_config.fsdp_use_orig_params",
      "fsdp_config.fsdp_cpu_ram_efficient_loading"};
  return keys;
}

constexpr std::array<std::string_view, 3> kSections = {"deepspeed_config", "fsdp_config",
                                                       "cxxlaunch"};

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

std::string formatNumber(double v) {
  std::ostringstream out;
  out.precision(15);
  out << v;
  return out.str();
}

std::string kindName(const KeySpec& spec) {
  switch (spec.type) {
    case KeyType::kBool:
      return "true or false";
    case KeyType::kInt:
      return "a whole number from " + formatNumber(spec.min) + " to " + formatNumber(spec.max);
    case KeyType::kNumber:
      return "a number >= " + formatNumber(spec.min);
    case KeyType::kSeconds:
      return "a number of seconds " + std::string(spec.min > 0 ? "> 0" : ">= 0");
    case KeyType::kChoice: {
      std::string list;
      for (size_t i = 0; i < spec.choices.size(); ++i) {
        list += (i == 0 ? "" : i + 1 == spec.choices.size() ? " or " : ", ") + spec.choices[i];
      }
      return "one of " + list;
    }
    case KeyType::kGpuIds:
      return "all or a comma-separated list of GPU ids, e.g. 0,1";
    case KeyType::kText:
      break;
  }
  return "text";
}

// Printable UTF-8: what a host name, a path or a class name can be, and what the writer can
// write back unchanged.
bool printableUtf8(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f) return false;
      ++i;
      continue;
    }
    const size_t n = c >= 0xf0 && c < 0xf5 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
    if (n == 0 || i + n > text.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(text[i + k]) & 0xc0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

// Parses `text` as `spec`'s type; returns the canonical text or "" with `why` set.
std::string canonical(const KeySpec& spec, const std::string& text, std::string& why) {
  switch (spec.type) {
    case KeyType::kBool: {
      const std::string t = lower(text);
      if (t == "true" || t == "yes" || t == "on" || t == "y" || t == "1") return "true";
      if (t == "false" || t == "no" || t == "off" || t == "n" || t == "0") return "false";
      break;
    }
    case KeyType::kInt: {
      // YAML writes big counts as 1e8 too; accept whole numbers in any notation.
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) ||
          v != std::floor(v)) {
        break;
      }
      if (v < spec.min || v > spec.max) {
        why = formatNumber(v) + " is out of range; use " + kindName(spec);
        return "";
      }
      return std::to_string(static_cast<long long>(v));
    }
    case KeyType::kNumber:
    case KeyType::kSeconds: {
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v)) break;
      if (v < spec.min || v > spec.max) {
        why = text + " is out of range; use " + kindName(spec);
        return "";
      }
      return formatNumber(v);
    }
    case KeyType::kChoice: {
      std::string t = text;
      if (spec.key == "fsdp_config.fsdp_sharding_strategy" && t.size() == 1 && t[0] >= '1' &&
          t[0] <= '5') {
        return kShardingStrategies[static_cast<size_t>(t[0] - '1')];
      }
      for (const auto& choice : spec.choices) {
        if (lower(choice) == lower(t)) return choice;
      }
      if (spec.key == "distributed_type") {
        why = "'" + text + "' is not supported by cxxlaunch; use " + kindName(spec);
        return "";
      }
      break;
    }
    case KeyType::kGpuIds: {
      if (lower(text) == "all") return "all";
      std::string out;
      std::istringstream in(text);
      std::string item;
      int count = 0;
      while (std::getline(in, item, ',')) {
        item.erase(0, item.find_first_not_of(' '));
        item.erase(item.find_last_not_of(' ') + 1);
        int id = -1;
        auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
        if (ec != std::errc() || ptr != item.data() + item.size() || id < 0 || id > 4096) {
          count = -1;
          break;
        }
        out += (count++ == 0 ? "" : ",") + std::to_string(id);
      }
      if (count > 0 && !text.empty() && text.back() != ',') return out;
      break;
    }
    case KeyType::kText:
      if (printableUtf8(text)) return text;
      why = "the value has control characters or is not valid UTF-8";
      return "";
  }
  why = "'" + text + "' is not " + kindName(spec);
  return "";
}

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
        const std::string best = closestMatch(key_node.Scalar(), knownKeysUnder(prefix));
        throw ConfigError(position(name_, key_node.Mark()) + ": unknown key '" + key + "'" +
                          (best.empty() ? "" : "; did you mean " + prefix + best + "?") +
                          " (see docs/config.md)");
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
  Config& config_;
  std::string name_;
};

std::string originName(const Origin& origin) {
  return origin.where.empty() ? "the default" : origin.where;
}

}  // namespace

bool parseValue(const KeySpec& spec, const std::string& text, std::string& value,
                std::string& why) {
  why.clear();
  value = canonical(spec, text, why);
  return why.empty();
}

const std::vector<KeySpec>& configSchema() {
  static const std::vector<KeySpec> schema = buildSchema();
  return schema;
}

const KeySpec* findKey(const std::string& key) {
  for (const auto& spec : configSchema()) {
    if (spec.key == key) return &spec;
  }
  return nullptr;
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

std::string closestMatch(const std::string& word, const std::vector<std::string>& candidates) {
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diagonal = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t above = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
        diagonal = above;
      }
    }
    return row[b.size()];
  };
  std::string best;
  size_t best_distance = std::max<size_t>(3, word.size() / 3) + 1;
  for (const auto& candidate : candidates) {
    if (size_t d = distance(lower(word), candidate); d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  return best;
}

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
    Loader(config, name).loadMap(root, "");
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
  const std::string temp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(temp, std::ios::trunc);
    out << writeConfigText(config);
    if (!out.flush()) throw ConfigError(path + ": cannot write (" + temp + ")");
  }
  fs::rename(temp, path, ec);
  if (ec) {
    fs::remove(temp, ec);
    throw ConfigError(path + ": cannot write the config file");
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

Config resolveConfig(const ConfigLayers& layers) {
  Config config;
  if (!layers.file.empty()) config = loadConfigFile(layers.file);
  for (const auto& spec : configSchema()) {
    if (spec.env.empty()) continue;
    if (auto it = layers.env.find(spec.env); it != layers.env.end()) {
      config.set(spec.key, it->second, {Origin::kEnv, spec.env});
    }
  }
  for (const auto& f : layers.flags) config.set(f.key, f.value, {Origin::kFlag, f.flag});
  validateConfig(config);
  return config;
}

void validateConfig(const Config& c) {
  auto at = [&](const std::string& key) { return originName(c.origin(key)); };
  auto fail = [&](const std::string& key, const std::string& message) {
    throw ConfigError(at(key) + ": " + message);
  };
  const std::string type = c.text("distributed_type");
  const bool cpu = c.flag("use_cpu") || type == "MULTI_CPU";
  if (c.text("compute_environment") == "AMAZON_SAGEMAKER") {
    fail("compute_environment",
         "AMAZON_SAGEMAKER is not supported: cxxlaunch starts workers on this machine; use "
         "LOCAL_MACHINE");
  }
  if (cpu && c.text("mixed_precision") == "fp16") {
    fail("mixed_precision",
         "fp16 needs a GPU, but this config trains on CPUs (" +
             (c.flag("use_cpu") ? "use_cpu at " + at("use_cpu")
                                : "distributed_type MULTI_CPU at " + at("distributed_type")) +
             "); use bf16 or no");
  }
  const long long machines = c.integer("num_machines");
  if (c.isSet("num_processes") && c.integer("num_processes") % machines != 0) {
    fail("num_processes", "num_processes is the total across machines and must divide evenly: " +
                              c.text("num_processes") + " processes on " +
                              std::to_string(machines) + " machines (num_machines at " +
                              at("num_machines") + ")");
  }
  if (c.integer("machine_rank") >= machines) {
    fail("machine_rank", "machine_rank " + c.text("machine_rank") + " is out of range for " +
                             std::to_string(machines) + " machine(s); use 0 to " +
                             std::to_string(machines - 1));
  }
  if (machines > 1 && c.text("main_process_ip").empty() &&
      c.text("cxxlaunch.rdzv_endpoint").empty()) {
    fail("num_machines",
         "a job on several machines needs main_process_ip: the address of the machine with "
         "machine_rank 0");
  }
  for (const auto& [device_key, path_key] :
       {std::pair<std::string, std::string>{"deepspeed_config.offload_optimizer_device",
                                            "deepspeed_config.offload_optimizer_nvme_path"},
        {"deepspeed_config.offload_param_device", "deepspeed_config.offload_param_nvme_path"}}) {
    if (c.text(device_key) != "nvme" || type != "DEEPSPEED") continue;
    const std::string path = c.text(path_key);
    const std::string flag = path_key.substr(path_key.find('.') + 1);
    if (path.empty()) {
      fail(device_key, "nvme offload needs a directory on local disk: set " + flag);
    }
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      fail(path_key, flag + " '" + path + "' is not an existing directory; create it first");
    }
    if (::access(path.c_str(), W_OK) != 0) {
      fail(path_key, flag + " '" + path + "' is not writable");
    }
  }
  if (type == "DEEPSPEED" && c.text("deepspeed_config.offload_param_device") == "nvme" &&
      c.integer("deepspeed_config.zero_stage") != 3) {
    fail("deepspeed_config.offload_param_device",
         "offload_param_device nvme needs zero_stage 3 (parameters sharded at rest)");
  }
  if (const std::string gpu_ids = c.text("gpu_ids");
      gpu_ids != "all" && c.isSet("num_processes") && !cpu) {
    const auto ids = std::count(gpu_ids.begin(), gpu_ids.end(), ',') + 1;
    const long long per_node = c.integer("num_processes") / machines;
    if (ids != per_node) {
      fail("gpu_ids", "gpu_ids names " + std::to_string(ids) + " GPU(s) but each machine runs " +
                          std::to_string(per_node) + " process(es) (num_processes at " +
                          at("num_processes") + "); give one GPU per process");
    }
  }
}

std::map<std::string, std::string> workerSettings(const Config& c,
                                                  const std::map<std::string, std::string>& env) {
  struct Derived {
    std::string value;
    Origin::Kind strongest = Origin::kDefault;
  };
  std::map<std::string, Derived> out;
  auto put = [&](const char* name, std::string value, std::initializer_list<const char*> from) {
    Derived d{std::move(value), Origin::kDefault};
    for (const char* key : from) d.strongest = std::max(d.strongest, c.origin(key).kind);
    out[name] = std::move(d);
  };
  const std::string type = c.text("distributed_type");
  const bool cpu = c.flag("use_cpu") || type == "MULTI_CPU";

  std::string strategy = "ddp";
  if (type == "DEEPSPEED" && c.integer("deepspeed_config.zero_stage") > 0) {
    strategy = "zero" + c.text("deepspeed_config.zero_stage");
  } else if (type == "FSDP") {
    std::string sharding = c.text("fsdp_config.fsdp_sharding_strategy");
    const std::string reshard = c.text("fsdp_config.fsdp_reshard_after_forward");
    if (!c.isSet("fsdp_config.fsdp_sharding_strategy") && !reshard.empty()) {
      sharding = reshard == "true" ? "FULL_SHARD" : reshard == "false" ? "SHARD_GRAD_OP" : reshard;
    }
    strategy = "fsdp_" + lower(sharding);
  }
  put(env::kStrategy, strategy,
      {"distributed_type", "deepspeed_config.zero_stage", "fsdp_config.fsdp_sharding_strategy",
       "fsdp_config.fsdp_reshard_after_forward"});
  const std::string precision = c.text("mixed_precision");
  put(env::kMixedPrecision, precision == "fp8" ? "bf16" : precision, {"mixed_precision"});
  put(env::kGradAccumSteps, c.text("deepspeed_config.gradient_accumulation_steps"),
      {"deepspeed_config.gradient_accumulation_steps"});
  put(env::kGradClipping, c.text("deepspeed_config.gradient_clipping"),
      {"deepspeed_config.gradient_clipping"});
  put(env::kBackend, cpu ? "gloo" : "auto", {"use_cpu", "distributed_type"});
  const bool deepspeed = type == "DEEPSPEED", fsdp = type == "FSDP";
  put(env::kOffloadOptimizer,
      deepspeed ? c.text("deepspeed_config.offload_optimizer_device")
      : fsdp && c.flag("fsdp_config.fsdp_offload_params") ? "cpu"
                                                          : "none",
      {"distributed_type", "deepspeed_config.offload_optimizer_device",
       "fsdp_config.fsdp_offload_params"});
  put(env::kOffloadParams,
      deepspeed ? c.text("deepspeed_config.offload_param_device")
      : fsdp && c.flag("fsdp_config.fsdp_offload_params") ? "cpu"
                                                          : "none",
      {"distributed_type", "deepspeed_config.offload_param_device",
       "fsdp_config.fsdp_offload_params"});
  if (deepspeed) {
    put(env::kOffloadOptimizerNvmePath, c.text("deepspeed_config.offload_optimizer_nvme_path"),
        {"deepspeed_config.offload_optimizer_nvme_path"});
    put(env::kOffloadParamNvmePath, c.text("deepspeed_config.offload_param_nvme_path"),
        {"deepspeed_config.offload_param_nvme_path"});
  }
  put(env::kCheckpointDir, c.text("cxxlaunch.checkpoint_dir"), {"cxxlaunch.checkpoint_dir"});
  put(env::kStateDictType,
      fsdp && c.text("fsdp_config.fsdp_state_dict_type") != "FULL_STATE_DICT" ? "sharded" : "full",
      {"distributed_type", "fsdp_config.fsdp_state_dict_type"});
  put(env::kDebug, c.text("debug"), {"debug"});
  put(env::kZero3Save16BitModel, c.text("deepspeed_config.zero3_save_16bit_model"),
      {"deepspeed_config.zero3_save_16bit_model"});
  put(env::kZero3InitFlag, c.text("deepspeed_config.zero3_init_flag"),
      {"deepspeed_config.zero3_init_flag"});
  if (fsdp) {
    const std::pair<const char*, const char*> fsdp_keys[] = {
        {env::kFsdpAutoWrapPolicy, "fsdp_config.fsdp_auto_wrap_policy"},
        {env::kFsdpTransformerLayerClsToWrap, "fsdp_config.fsdp_transformer_layer_cls_to_wrap"},
        {env::kFsdpMinNumParams, "fsdp_config.fsdp_min_num_params"},
        {env::kFsdpBackwardPrefetch, "fsdp_config.fsdp_backward_prefetch"},
        {env::kFsdpForwardPrefetch, "fsdp_config.fsdp_forward_prefetch"},
        {env::kFsdpSyncModuleStates, "fsdp_config.fsdp_sync_module_states"},
        {env::kFsdpActivationCheckpointing, "fsdp_config.fsdp_activation_checkpointing"}};
    for (const auto& [name, key] : fsdp_keys) put(name, c.text(key), {key});
  }
  std::map<std::string, std::string> settings;
  for (auto& [name, derived] : out) {
    auto it = env.find(name);
    const bool env_wins = it != env.end() && derived.strongest < Origin::kFlag;
    settings[name] = env_wins ? it->second : derived.value;
  }
  return settings;
}

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
