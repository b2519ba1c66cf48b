// The worker environment: the training settings (common/env_names.h) that the resolved config
// becomes for every worker, and which of them a CXXLAUNCH_* variable may override.

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "common/env_names.h"
#include "launcher/config.h"
#include "launcher/config_internal.h"

namespace cxxlaunch::launcher {

using namespace config_detail;  // NOLINT(google-build-using-namespace)

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
  put(env::kCheckpointTotalLimit, c.text("cxxlaunch.checkpoint_total_limit"),
      {"cxxlaunch.checkpoint_total_limit"});
  put(env::kLogWith, c.text("cxxlaunch.log_with"), {"cxxlaunch.log_with"});
  put(env::kProjectDir, c.text("cxxlaunch.project_dir"), {"cxxlaunch.project_dir"});
  put(env::kCheckpointAsync, c.text("cxxlaunch.checkpoint_async"), {"cxxlaunch.checkpoint_async"});
  // saveState's layout: FSDP's fsdp_state_dict_type (FULL_STATE_DICT gathers to rank 0); every
  // other mode saves one file per rank, as DeepSpeed's save_checkpoint writes its partitions.
  put(env::kStateDictType,
      fsdp && c.text("fsdp_config.fsdp_state_dict_type") == "FULL_STATE_DICT" ? "full" : "sharded",
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
        {env::kFsdpActivationCheckpointing, "fsdp_config.fsdp_activation_checkpointing"},
        {env::kFsdpCpuRamEfficientLoading, "fsdp_config.fsdp_cpu_ram_efficient_loading"}};
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

}  // namespace cxxlaunch::launcher
