#pragma once
// The settings the Accelerator reads (a public header): WorkerEnv, the launcher's contract
// (docs/env.md) read once into a typed struct, and AcceleratorOptions, a trainer's overrides of
// them. A program started without the launcher gets a world of one: rank 0 of 1, no store.
// readWorkerEnv() throws InvalidArgument naming the variable when a value is malformed.
// Thread-safety: reads the process environment; call it before starting threads that setenv.

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cxxlaunch::runtime {

// The settings the runtime branches on, parsed once here from the launcher's strings.
// CXXLAUNCH_STRATEGY's values: DeepSpeed's ZeRO stages and FSDP's sharding strategies.
enum class StrategyKind {
  kDdp,
  kZero1,
  kZero2,
  kZero3,
  kFsdpFullShard,
  kFsdpShardGradOp,
  kFsdpHybridShard,
  kFsdpHybridShardZero2,
  kFsdpNoShard,
};

// The strategy setting: its kind, what that shards, and its name ("zero3"), which it compares
// and prints as, so that `env.strategy == "zero3"` and `std::cout << env.strategy` read as
// they did when it was a string.
class StrategySetting {
 public:
  // Implicit, as the string was: `env.strategy = "zero3"`. A name that is no strategy throws
  // InvalidArgument listing the names.
  // NOLINTBEGIN(google-explicit-constructor)
  StrategySetting() = default;  // ddp
  StrategySetting(StrategyKind kind) : kind_(kind) {}
  StrategySetting(std::string_view name);
  StrategySetting(const char* name) : StrategySetting(std::string_view(name)) {}
  StrategySetting(const std::string& name) : StrategySetting(std::string_view(name)) {}
  // NOLINTEND(google-explicit-constructor)

  StrategyKind kind() const { return kind_; }
  std::string_view name() const;
  operator std::string() const { return std::string(name()); }  // NOLINT(google-explicit-*)
  // 0: nothing sharded (ddp, fsdp_no_shard); 1: optimizer state (zero1); 2: and gradients
  // (zero2, fsdp_shard_grad_op, fsdp_hybrid_shard_zero2); 3: and parameters at rest.
  int stage() const;
  bool hybrid() const;  // sharded within a node, replicated across nodes

  // One overload per argument type: with fewer, a string literal converts two ways.
  friend bool operator==(const StrategySetting& a, const StrategySetting& b) {
    return a.kind_ == b.kind_;
  }
  friend bool operator==(const StrategySetting& a, StrategyKind b) { return a.kind_ == b; }
  friend bool operator==(const StrategySetting& a, std::string_view b) { return a.name() == b; }
  friend bool operator==(const StrategySetting& a, const char* b) { return a.name() == b; }
  friend bool operator==(const StrategySetting& a, const std::string& b) { return a.name() == b; }
  friend std::ostream& operator<<(std::ostream& out, const StrategySetting& s);

 private:
  StrategyKind kind_ = StrategyKind::kDdp;
};

// deepspeed_config.offload_optimizer_device / offload_param_device (FSDP's
// fsdp_offload_params is kCpu for both).
enum class OffloadDevice { kNone, kCpu, kNvme };
std::string_view offloadDeviceName(OffloadDevice device);  // "none", "cpu", "nvme"

// fsdp_auto_wrap_policy: kNone when unset (accelerate's default: with layer type names given,
// they select by type all the same).
enum class WrapPolicy { kNone, kTransformerBased, kSizeBased, kNoWrap };
// fsdp_backward_prefetch: the next unit's gather starts before a unit's backward (kPre), after
// it (kPost), or not before it is needed (kNone).
enum class BackwardPrefetch { kPre, kPost, kNone };
// How a checkpoint lays the state out, as FSDP's state_dict_type: each rank's own state in its
// own file (SHARDED_STATE_DICT), or every parameter whole in rank 0's file (FULL_STATE_DICT).
enum class StateDictType { kSharded, kFull };

struct WorkerEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int node_rank = 0;
  int num_nodes = 1;
  std::string role = "default";
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: no launcher, nothing reserved
  int restart_count = 0;
  int max_restarts = 0;
  std::string run_id;
  std::string error_file;
  std::string store_endpoint;  // empty: no rendezvous store (single process)
  std::string store_prefix;
  std::string token;                    // etcd: the store user's password
  std::string store_user;               // etcd: CXXLAUNCH_STORE_USER
  std::optional<int> device;            // GPU id chosen by the launcher, if any
  std::string node_addr = "127.0.0.1";  // where other ranks reach this one
  std::string tls_ca, tls_cert, tls_key;

  // Training settings (docs/env.md), validated.
  StrategySetting strategy;  // ddp
  std::string mixed_precision = "no";
  int gradient_accumulation_steps = 1;
  double gradient_clipping = 0;  // max norm; 0: no clipping
  std::string backend = "auto";
  bool shared_memory = true;  // Gloo: allreduce through shared memory when all ranks are local
  OffloadDevice offload_optimizer = OffloadDevice::kNone;
  OffloadDevice offload_params = OffloadDevice::kNone;
  std::string offload_optimizer_nvme_path, offload_param_nvme_path;  // nvme's directories
  std::string checkpoint_dir;                                        // "" : none configured
  int64_t checkpoint_total_limit = 0;                                // 0: keep every one
  std::vector<std::string> log_with;  // trackers (docs/observability.md); empty: none
  std::string project_dir;            // where the trackers write; "" : none configured
  bool checkpoint_async = false;      // saves written in the background (docs/checkpoints.md)
  // saveState's layout (CXXLAUNCH_STATE_DICT_TYPE sharded | full): full gathers every
  // parameter whole to rank 0 while it writes.
  StateDictType state_dict_type = StateDictType::kSharded;
  std::string heartbeat_file;  // touched at every micro-step (the launcher's --watchdog_timeout)
  bool debug = false;  // accelerate's debug: collectives compared across ranks before they run
  int64_t collective_timeout_s = 300;  // how long one collective may take before it fails
  // FSDP (accelerate's values; read whatever the strategy, since ZeRO-3 chooses units alike).
  WrapPolicy fsdp_auto_wrap_policy = WrapPolicy::kNone;
  std::vector<std::string> fsdp_transformer_layer_cls;  // module type names
  int64_t fsdp_min_num_params = 100000000;              // SIZE_BASED_WRAP's threshold
  BackwardPrefetch fsdp_backward_prefetch = BackwardPrefetch::kPre;
  bool fsdp_forward_prefetch = false;
  bool fsdp_sync_module_states = true;
  bool fsdp_activation_checkpointing = false;
  // deepspeed_config.zero3_save_16bit_model: saveModel writes 16-bit weights by default.
  bool zero3_save_16bit_model = false;
  // deepspeed_config.zero3_init_flag, fsdp_config.fsdp_cpu_ram_efficient_loading: the model is
  // built without memory and materialised shard by shard (Accelerator::deferredInit).
  bool zero3_init_flag = false;
  bool fsdp_cpu_ram_efficient_loading = false;

  bool launched() const { return !run_id.empty(); }
  bool offloads(OffloadDevice device) const {
    return offload_optimizer == device || offload_params == device;
  }
};

WorkerEnv readWorkerEnv();

// fp16's dynamic loss scaling, as DeepSpeed's DynamicLossScaler and
// PyTorch's GradScaler.
struct LossScalerOptions {
  double initial_scale = 65536;  // 2^16, DeepSpeed's initial_scale_power 16
  double growth_factor = 2;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // DeepSpeed's loss_scale_window is 1000
  int hysteresis = 2;
  double min_scale = 1;
};

// The mixed precision a run computes in (docs/runtime.md: what each strategy does with it).
struct PrecisionPolicy {
  std::string name = "no";                           // no | bf16 | fp16
  c10::ScalarType compute = c10::ScalarType::Float;  // what the model computes in
  bool mixed() const { return compute != c10::ScalarType::Float; }
  bool scalesLoss() const { return compute == c10::ScalarType::Half; }
};

// A trainer's overrides of the launch's settings: Accelerator(AcceleratorOptions{...}).
struct AcceleratorOptions {
  std::optional<int> gradient_accumulation_steps;  // default: CXXLAUNCH_GRADIENT_ACCUMULATION_STEPS
  std::optional<double> gradient_clipping;         // default: CXXLAUNCH_GRADIENT_CLIPPING
  std::optional<std::string> backend;              // default: CXXLAUNCH_BACKEND
  std::optional<std::string> mixed_precision;      // default: CXXLAUNCH_MIXED_PRECISION
  // Dynamic loss scaling: always on for fp16 (with these settings, or the defaults); given for
  // another precision, its loss is scaled too.
  std::optional<LossScalerOptions> loss_scaling;
  size_t bucket_bytes = 25u << 20;
  // PyTorch's find_unused_parameters: exact optimizer semantics for parameters no rank used,
  // for one more small collective per step.
  bool find_unused_parameters = false;
  std::optional<std::string> checkpoint_dir;  // default: CXXLAUNCH_CHECKPOINT_DIR
  // What saveCheckpoint names its checkpoints: <prefix><optimizer steps>. "checkpoint_" as
  // accelerate's save_state(automatic naming) does, or "checkpoint-" as HF Trainer does; resume
  // and pruning find both. Anything else is InvalidArgument.
  std::string checkpoint_prefix = "checkpoint_";
  // saveCheckpoint keeps the newest this many (accelerate's total_limit); 0: all of them.
  // Unset: the launch's (--checkpoint_total_limit, CXXLAUNCH_CHECKPOINT_TOTAL_LIMIT,
  // cxxlaunch.checkpoint_total_limit), else 0.
  std::optional<int64_t> checkpoint_total_limit;
  // The trackers log() writes to (accelerate's log_with): a comma list of tensorboard, csv,
  // jsonl, or "all". Unset: the launch's (--log_with, CXXLAUNCH_LOG_WITH, cxxlaunch.log_with).
  std::optional<std::string> log_with;
  std::optional<std::string> project_dir;  // default: CXXLAUNCH_PROJECT_DIR (--project_dir)
  int report_every = 10;                   // logs between rewrites of report.html
  // saveState / saveCheckpoint return once this rank's state is copied into host memory and
  // write it in the background (docs/checkpoints.md#asynchronous-saves). Unset: the launch's
  // (--checkpoint_async, CXXLAUNCH_CHECKPOINT_ASYNC, cxxlaunch.checkpoint_async), else false.
  std::optional<bool> checkpoint_async;
};

}  // namespace cxxlaunch::runtime
