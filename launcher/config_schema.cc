// The schema: every key accelerate's files and cxxlaunch's own section can hold, its type, range,
// default, flag and variable, in file order; and the accelerate keys accepted without effect.

#include "launcher/config.h"
#include "launcher/config_internal.h"

namespace cxxlaunch::launcher {

using namespace config_detail;  // NOLINT(google-build-using-namespace)

namespace {

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
      choiceKey("rdzv_backend", {"static", "c10d", "etcd", "etcd-v2"}, "static", "",
                "CXXLAUNCH_RDZV_BACKEND",
                "static: ranks by machine_rank; c10d: by arrival; etcd (etcd-v2): an etcd at "
                "main_process_ip:main_process_port keeps the rendezvous (--rdzv_backend)"),
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
      textKey("deepspeed_config.offload_param_nvme_path", K::kText, "", "offload_param_nvme_path",
              "CXXLAUNCH_OFFLOAD_PARAM_NVME_PATH",
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
      textKey("deepspeed_config.deepspeed_config_file", K::kText, "", "deepspeed_config_file",
              "CXXLAUNCH_DEEPSPEED_CONFIG_FILE",
              "a DeepSpeed JSON config: its ZeRO stage, offload, accumulation, clipping and "
              "precision are read as these keys"),
      textKey("deepspeed_config.deepspeed_hostfile", K::kText, "", "hostfile", "CXXLAUNCH_HOSTFILE",
              "DeepSpeed's hostfile ('HOST slots=N' lines): start one launcher per host over ssh "
              "(the clusters guide; from the file only with num_machines > 1, as accelerate)"),
      textKey("deepspeed_config.deepspeed_inclusion_filter", K::kText, "", "include",
              "CXXLAUNCH_INCLUDE", "hostfile: only these hosts and slots, e.g. node1:0,1@node2"),
      textKey("deepspeed_config.deepspeed_exclusion_filter", K::kText, "", "exclude",
              "CXXLAUNCH_EXCLUDE", "hostfile: all but these hosts and slots, e.g. node1:0@node3"),
      choiceKey("deepspeed_config.deepspeed_multinode_launcher",
                {"pdsh", "standard", "openmpi", "mvapich", "mpich", "impi", "nossh", "slurm"},
                "pdsh", "deepspeed_multinode_launcher", "CXXLAUNCH_DEEPSPEED_MULTINODE_LAUNCHER",
                "pdsh: the hostfile's hosts over ssh; standard, nossh: a launcher on each "
                "machine; MPI and slurm: refused, use mpirun or srun (the clusters guide)"),
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
      boolKey("fsdp_config.fsdp_cpu_ram_efficient_loading", "false",
              "fsdp_cpu_ram_efficient_loading", "CXXLAUNCH_FSDP_CPU_RAM_EFFICIENT_LOADING",
              "FSDP: build the model already sharded (as zero3_init_flag)"),
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
      rangeKey("cxxlaunch.checkpoint_total_limit", K::kInt, 0, 1e6, "0", "checkpoint_total_limit",
               "CXXLAUNCH_CHECKPOINT_TOTAL_LIMIT",
               "saveCheckpoint keeps the newest N complete checkpoints (accelerate's total_limit); "
               "0: all"),
      textKey("cxxlaunch.log_with", K::kText, "", "log_with", "CXXLAUNCH_LOG_WITH",
              "trackers acc.log writes to, a comma list of tensorboard, csv, jsonl (or all); "
              "unset: none (the observability guide)"),
      textKey("cxxlaunch.project_dir", K::kText, "", "project_dir", "CXXLAUNCH_PROJECT_DIR",
              "folder the trackers and report.html are written into"),
      boolKey("cxxlaunch.checkpoint_async", "false", "checkpoint_async",
              "CXXLAUNCH_CHECKPOINT_ASYNC",
              "saves return once the state is copied to host memory; a background thread writes "
              "it (the checkpoints guide)"),
      textKey("cxxlaunch.log_dir", K::kText, "", "", "CXXLAUNCH_LOG_DIR",
              "per-rank logs (--log_dir; unset: $TMPDIR/cxxlaunch-UID)"),
      choiceKey("cxxlaunch.progress", {"auto", "on", "off"}, "auto", "progress",
                "CXXLAUNCH_PROGRESS",
                "progress on the console: a live line when stdout is a terminal (auto, on), plain "
                "lines elsewhere (on), none (off)"),
      textKey("cxxlaunch.token_file", K::kText, "", "", "CXXLAUNCH_TOKEN_FILE",
              "file holding the job token (--rdzv_conf token_file=)"),
      textKey("cxxlaunch.rdzv_endpoint", K::kText, "", "", "CXXLAUNCH_RDZV_ENDPOINT",
              "HOST:PORT of the rendezvous; overrides main_process_ip/port (--rdzv_endpoint)"),
      textKey("cxxlaunch.rdzv_id", K::kText, "", "", "CXXLAUNCH_RDZV_ID",
              "job id, the same on every node (--rdzv_id; unset: from main_process_ip/port)"),
      boolKey("cxxlaunch.use_cluster_env", "true", "use_cluster_env", "CXXLAUNCH_USE_CLUSTER_ENV",
              "take nodes, node rank, rendezvous host, run id and workers per node from Slurm's "
              "or MPI's variables (the clusters guide)"),
      rangeKey("cxxlaunch.num_nodes", K::kInt, 1, 65536, "", "num_nodes", "CXXLAUNCH_NUM_NODES",
               "hostfile: its first N hosts (DeepSpeed's --num_nodes)"),
      rangeKey("cxxlaunch.num_gpus", K::kInt, 1, 65536, "", "num_gpus", "CXXLAUNCH_NUM_GPUS",
               "hostfile: the first N slots of each host (DeepSpeed's --num_gpus)"),
      textKey("cxxlaunch.ssh_opts", K::kText, "", "ssh_opts", "CXXLAUNCH_SSH_OPTS",
              "hostfile: options for ssh, split at spaces, e.g. '-p 2222 -i ~/.ssh/job'"),
  };
}

}  // namespace

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

const std::set<std::string>& config_detail::ignoredKeys() {
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
      "num_cpu_threads_per_process", "deepspeed_config.deepspeed_moe_layer_cls_names",
      "fsdp_config.fsdp_version", "fsdp_config.fsdp_use_orig_params"};
  return keys;
}

}  // namespace cxxlaunch::launcher
