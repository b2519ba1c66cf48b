#include "runtime/env.h"

#include <array>
#include <charconv>
#include <cstdlib>
#include <ostream>

#include "common/env_names.h"
#include "common/error.h"
#include "common/tracker_names.h"

namespace cxxlaunch::runtime {
namespace {

using StrategyChoice = std::pair<const char*, StrategyKind>;
constexpr std::array<StrategyChoice, 9> kStrategies = {{
    {"ddp", StrategyKind::kDdp},
    {"zero1", StrategyKind::kZero1},
    {"zero2", StrategyKind::kZero2},
    {"zero3", StrategyKind::kZero3},
    {"fsdp_full_shard", StrategyKind::kFsdpFullShard},
    {"fsdp_shard_grad_op", StrategyKind::kFsdpShardGradOp},
    {"fsdp_hybrid_shard", StrategyKind::kFsdpHybridShard},
    {"fsdp_hybrid_shard_zero2", StrategyKind::kFsdpHybridShardZero2},
    {"fsdp_no_shard", StrategyKind::kFsdpNoShard},
}};

using OffloadChoice = std::pair<const char*, OffloadDevice>;
constexpr std::array<OffloadChoice, 3> kOffloadDevices = {{
    {"none", OffloadDevice::kNone},
    {"cpu", OffloadDevice::kCpu},
    {"nvme", OffloadDevice::kNvme},
}};

template <typename Choices>
std::string names(const Choices& choices) {
  std::string list;
  for (const auto& [choice, value] : choices)
    list += (list.empty() ? "" : ", ") + std::string(choice);
  return list;
}

std::optional<std::string> lookup(const char* name) {
  const char* value = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): documented contract
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

template <typename Int>
void readInt(const char* name, Int& out) {
  auto text = lookup(name);
  if (!text) return;
  Int value = 0;
  auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (ec != std::errc() || end != text->data() + text->size()) {
    throw InvalidArgument(std::string("environment variable ") + name + "='" + *text +
                          "' is not an integer; unset it or start the program with cxxlaunch run");
  }
  out = value;
}

void readString(const char* name, std::string& out) {
  if (auto text = lookup(name)) out = *text;
}

void readChoice(const char* name, std::string& out, std::initializer_list<const char*> choices) {
  auto text = lookup(name);
  if (!text || text->empty()) return;
  for (const char* choice : choices) {
    if (*text == choice) {
      out = *text;
      return;
    }
  }
  std::string list;
  for (const char* choice : choices) list += (list.empty() ? "" : ", ") + std::string(choice);
  throw InvalidArgument(std::string("environment variable ") + name + "='" + *text +
                        "' is not one of: " + list);
}

// The same for a setting parsed into an enum: `choices` pairs each accepted text with its value.
template <typename T, typename Choices = std::initializer_list<std::pair<const char*, T>>>
void readChoice(const char* name, T& out, const Choices& choices) {
  auto text = lookup(name);
  if (!text || text->empty()) return;
  for (const auto& [choice, value] : choices) {
    if (*text == choice) {
      out = value;
      return;
    }
  }
  throw InvalidArgument(std::string("environment variable ") + name + "='" + *text +
                        "' is not one of: " + names(choices));
}

void readBool(const char* name, bool& out) {
  auto text = lookup(name);
  if (!text || text->empty()) return;
  if (*text == "true" || *text == "1") {
    out = true;
  } else if (*text == "false" || *text == "0") {
    out = false;
  } else {
    throw InvalidArgument(std::string("environment variable ") + name + "='" + *text +
                          "' is not true or false");
  }
}

std::vector<std::string> splitNames(const std::string& text) {
  std::vector<std::string> names;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    std::string name = text.substr(start, end - start);
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    if (!name.empty()) names.push_back(name);
    start = end + 1;
  }
  return names;
}

}  // namespace

StrategySetting::StrategySetting(std::string_view name) {
  for (const auto& [choice, kind] : kStrategies) {
    if (name == choice) {
      kind_ = kind;
      return;
    }
  }
  throw InvalidArgument("strategy '" + std::string(name) +
                        "' is not one of: " + names(kStrategies));
}

std::string_view StrategySetting::name() const {
  for (const auto& [choice, kind] : kStrategies) {
    if (kind == kind_) return choice;
  }
  return "unknown";  // unreachable: every kind has a name
}

int StrategySetting::stage() const {
  switch (kind_) {
    case StrategyKind::kDdp:
    case StrategyKind::kFsdpNoShard:
      return 0;
    case StrategyKind::kZero1:
      return 1;
    case StrategyKind::kZero2:
    case StrategyKind::kFsdpShardGradOp:
    case StrategyKind::kFsdpHybridShardZero2:
      return 2;
    case StrategyKind::kZero3:
    case StrategyKind::kFsdpFullShard:
    case StrategyKind::kFsdpHybridShard:
      return 3;
  }
  return 3;
}

bool StrategySetting::hybrid() const {
  return kind_ == StrategyKind::kFsdpHybridShard || kind_ == StrategyKind::kFsdpHybridShardZero2;
}

std::ostream& operator<<(std::ostream& out, const StrategySetting& s) { return out << s.name(); }

std::string_view offloadDeviceName(OffloadDevice device) {
  for (const auto& [choice, value] : kOffloadDevices) {
    if (value == device) return choice;
  }
  return "unknown";  // unreachable: every device has a name
}

WorkerEnv readWorkerEnv() {
  WorkerEnv e;
  readInt(env::kRank, e.rank);
  readInt(env::kLocalRank, e.local_rank);
  readInt(env::kWorldSize, e.world_size);
  readInt(env::kLocalWorldSize, e.local_world_size);
  readInt(env::kGroupRank, e.node_rank);
  readInt(env::kGroupWorldSize, e.num_nodes);
  readString(env::kRoleName, e.role);
  readString(env::kMasterAddr, e.master_addr);
  readInt(env::kMasterPort, e.master_port);
  readInt(env::kRestartCount, e.restart_count);
  readInt(env::kMaxRestarts, e.max_restarts);
  readString(env::kRunId, e.run_id);
  readString(env::kErrorFile, e.error_file);
  readString(env::kStoreEndpoint, e.store_endpoint);
  readString(env::kStorePrefix, e.store_prefix);
  readString(env::kToken, e.token);
  readString(env::kStoreUser, e.store_user);
  int device = -1;
  readInt(env::kDevice, device);
  if (device >= 0) e.device = device;
  readString(env::kNodeAddr, e.node_addr);
  readString(env::kTlsCa, e.tls_ca);
  readString(env::kTlsCert, e.tls_cert);
  readString(env::kTlsKey, e.tls_key);
  StrategyKind strategy = StrategyKind::kDdp;
  readChoice(env::kStrategy, strategy, kStrategies);
  e.strategy = strategy;
  readChoice(env::kMixedPrecision, e.mixed_precision, {"no", "fp16", "bf16"});
  readChoice(env::kBackend, e.backend, {"auto", "gloo", "nccl"});
  std::string shared_memory = "on";
  readChoice(env::kSharedMemory, shared_memory, {"on", "off"});
  e.shared_memory = shared_memory == "on";
  readChoice(env::kOffloadOptimizer, e.offload_optimizer, kOffloadDevices);
  readChoice(env::kOffloadParams, e.offload_params, kOffloadDevices);
  readString(env::kOffloadOptimizerNvmePath, e.offload_optimizer_nvme_path);
  readString(env::kOffloadParamNvmePath, e.offload_param_nvme_path);
  readString(env::kCheckpointDir, e.checkpoint_dir);
  readInt(env::kCheckpointTotalLimit, e.checkpoint_total_limit);
  if (e.checkpoint_total_limit < 0) {
    throw InvalidArgument(std::string(env::kCheckpointTotalLimit) + "=" +
                          std::to_string(e.checkpoint_total_limit) +
                          " is negative; give the number of checkpoints to keep, or 0 for all");
  }
  std::string log_with;
  readString(env::kLogWith, log_with);
  e.log_with = parseTrackerList(log_with, env::kLogWith);
  readString(env::kProjectDir, e.project_dir);
  readBool(env::kCheckpointAsync, e.checkpoint_async);
  readChoice<StateDictType>(env::kStateDictType, e.state_dict_type,
                            {{"sharded", StateDictType::kSharded}, {"full", StateDictType::kFull}});
  readBool(env::kDebug, e.debug);
  readString(env::kHeartbeatFile, e.heartbeat_file);
  readInt(env::kCollectiveTimeout, e.collective_timeout_s);
  if (e.collective_timeout_s < 1 || e.collective_timeout_s > 7 * 24 * 3600) {
    throw InvalidArgument(std::string(env::kCollectiveTimeout) +
                          " must be between 1 and 604800 seconds");
  }
  readChoice<WrapPolicy>(env::kFsdpAutoWrapPolicy, e.fsdp_auto_wrap_policy,
                         {{"TRANSFORMER_BASED_WRAP", WrapPolicy::kTransformerBased},
                          {"SIZE_BASED_WRAP", WrapPolicy::kSizeBased},
                          {"NO_WRAP", WrapPolicy::kNoWrap}});
  if (auto names = lookup(env::kFsdpTransformerLayerClsToWrap)) {
    e.fsdp_transformer_layer_cls = splitNames(*names);
  }
  readInt(env::kFsdpMinNumParams, e.fsdp_min_num_params);
  if (e.fsdp_min_num_params < 0) {
    throw InvalidArgument(std::string(env::kFsdpMinNumParams) + " must be >= 0");
  }
  readChoice<BackwardPrefetch>(env::kFsdpBackwardPrefetch, e.fsdp_backward_prefetch,
                               {{"BACKWARD_PRE", BackwardPrefetch::kPre},
                                {"BACKWARD_POST", BackwardPrefetch::kPost},
                                {"NO_PREFETCH", BackwardPrefetch::kNone}});
  readBool(env::kFsdpForwardPrefetch, e.fsdp_forward_prefetch);
  readBool(env::kZero3Save16BitModel, e.zero3_save_16bit_model);
  readBool(env::kZero3InitFlag, e.zero3_init_flag);
  readBool(env::kFsdpCpuRamEfficientLoading, e.fsdp_cpu_ram_efficient_loading);
  readBool(env::kFsdpSyncModuleStates, e.fsdp_sync_module_states);
  readBool(env::kFsdpActivationCheckpointing, e.fsdp_activation_checkpointing);
  readInt(env::kGradAccumSteps, e.gradient_accumulation_steps);
  if (e.gradient_accumulation_steps < 1) {
    throw InvalidArgument(std::string(env::kGradAccumSteps) + " must be >= 1");
  }
  if (auto clip = lookup(env::kGradClipping)) {
    char* end = nullptr;
    e.gradient_clipping = std::strtod(clip->c_str(), &end);
    if (clip->empty() || *end != '\0' || e.gradient_clipping < 0) {
      throw InvalidArgument(std::string(env::kGradClipping) + "='" + *clip +
                            "' is not a max norm >= 0");
    }
  }
  if (e.world_size < 1 || e.rank < 0 || e.rank >= e.world_size) {
    throw InvalidArgument("environment: RANK=" + std::to_string(e.rank) +
                          " is outside WORLD_SIZE=" + std::to_string(e.world_size));
  }
  return e;
}

}  // namespace cxxlaunch::runtime
