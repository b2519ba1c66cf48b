#pragma once
// The launcher -> worker contract: every environment variable that `cxxlaunch run` sets for a
// worker, in one place. The launcher writes them, `runtime/env.h` reads them, and
// docs/env.md lists them for users. Dependency-free so the launcher can include it without
// LibTorch.
//
// The first group is torchrun's, with torchrun's meaning, so stock PyTorch programs
// (`init_process_group` with `env://`) run under cxxlaunch unchanged.

namespace cxxlaunch::env {

// --- torchrun-compatible ---------------------------------------------------------------
inline constexpr const char kRank[] = "RANK";                        // global rank
inline constexpr const char kLocalRank[] = "LOCAL_RANK";             // rank on this node
inline constexpr const char kWorldSize[] = "WORLD_SIZE";             // workers in the job
inline constexpr const char kLocalWorldSize[] = "LOCAL_WORLD_SIZE";  // workers on this node
inline constexpr const char kGroupRank[] = "GROUP_RANK";             // node rank
inline constexpr const char kGroupWorldSize[] = "GROUP_WORLD_SIZE";  // number of nodes
inline constexpr const char kRoleName[] = "ROLE_NAME";               // --role
inline constexpr const char kRoleRank[] = "ROLE_RANK";               // rank among this role
inline constexpr const char kRoleWorldSize[] = "ROLE_WORLD_SIZE";    // workers of this role
inline constexpr const char kMasterAddr[] = "MASTER_ADDR";           // host of global rank 0
inline constexpr const char kMasterPort[] = "MASTER_PORT";           // free port reserved there
inline constexpr const char kRestartCount[] = "TORCHELASTIC_RESTART_COUNT";  // restarts so far
inline constexpr const char kMaxRestarts[] = "TORCHELASTIC_MAX_RESTARTS";    // --max_restarts
inline constexpr const char kRunId[] = "TORCHELASTIC_RUN_ID";                // --run_id
inline constexpr const char kErrorFile[] = "TORCHELASTIC_ERROR_FILE";  // JSON error report path
inline constexpr const char kOmpNumThreads[] = "OMP_NUM_THREADS";      // 1 if unset and >1 worker
// Set for a job that spans nodes, unless the user set them: the interface that holds the node's
// address, so that PyTorch's Gloo and NCCL bind there and not to what the host name resolves to.
inline constexpr const char kGlooSocketIfname[] = "GLOO_SOCKET_IFNAME";
inline constexpr const char kNcclSocketIfname[] = "NCCL_SOCKET_IFNAME";

// --- cxxlaunch's own -------------------------------------------------------------------
inline constexpr const char kStoreEndpoint[] =
    "CXXLAUNCH_STORE_ENDPOINT";  // host:port of the store, or etcd://HOST:PORT,... (etcd)
inline constexpr const char kStorePrefix[] =
    "CXXLAUNCH_STORE_PREFIX";  // RUN_ID/ROUND: key space and fencing token
inline constexpr const char kToken[] = "CXXLAUNCH_TOKEN";  // job token (etcd: the password)
inline constexpr const char kStoreUser[] = "CXXLAUNCH_STORE_USER";  // etcd user of the store
inline constexpr const char kNodeAddr[] = "CXXLAUNCH_NODE_ADDR";    // this node's address for peers
inline constexpr const char kTlsCa[] = "CXXLAUNCH_TLS_CA";      // CA file, when the store uses TLS
inline constexpr const char kTlsCert[] = "CXXLAUNCH_TLS_CERT";  // client certificate (mutual TLS)
inline constexpr const char kTlsKey[] = "CXXLAUNCH_TLS_KEY";    // its key
inline constexpr const char kDevice[] = "CXXLAUNCH_DEVICE";     // this worker's GPU id, from --gpus

// --- training settings -------------------------------------------------------------------
// Resolved by the launcher from flags > CXXLAUNCH_* environment > config file > defaults
// (docs/config.md), read by the runtime (runtime/env.h). Unset means the default.
inline constexpr const char kStrategy[] = "CXXLAUNCH_STRATEGY";
//   ddp (default) | zero1 | zero2 | zero3 | fsdp_full_shard | fsdp_shard_grad_op |
//   fsdp_hybrid_shard | fsdp_no_shard
inline constexpr const char kMixedPrecision[] = "CXXLAUNCH_MIXED_PRECISION";  // no | fp16 | bf16
inline constexpr const char kGradAccumSteps[] = "CXXLAUNCH_GRADIENT_ACCUMULATION_STEPS";  // >= 1
inline constexpr const char kGradClipping[] = "CXXLAUNCH_GRADIENT_CLIPPING";  // max norm; 0: none
inline constexpr const char kBackend[] = "CXXLAUNCH_BACKEND";  // auto (default) | gloo | nccl
inline constexpr const char kSharedMemory[] =
    "CXXLAUNCH_SHARED_MEMORY";  // on (default) | off: Gloo reduces through /dev/shm on one host
inline constexpr const char kOffloadOptimizer[] =
    "CXXLAUNCH_OFFLOAD_OPTIMIZER";                                          // none | cpu | nvme
inline constexpr const char kOffloadParams[] = "CXXLAUNCH_OFFLOAD_PARAMS";  // none | cpu | nvme
// nvme offload's directories on local disk (DeepSpeed's offload_*_nvme_path)
inline constexpr const char kOffloadOptimizerNvmePath[] = "CXXLAUNCH_OFFLOAD_OPTIMIZER_NVME_PATH";
inline constexpr const char kOffloadParamNvmePath[] = "CXXLAUNCH_OFFLOAD_PARAM_NVME_PATH";
inline constexpr const char kStateDictType[] = "CXXLAUNCH_STATE_DICT_TYPE";  // full | sharded
// The folder workers save checkpoints into and resume from (Accelerator::saveCheckpoint/resume).
inline constexpr const char kCheckpointDir[] = "CXXLAUNCH_CHECKPOINT_DIR";
// How many complete checkpoints saveCheckpoint keeps there (accelerate's total_limit); 0: all.
inline constexpr const char kCheckpointTotalLimit[] = "CXXLAUNCH_CHECKPOINT_TOTAL_LIMIT";
// The trackers Accelerator::log writes to (a comma list: tensorboard, csv, jsonl; accelerate's
// log_with), and the folder they, config.json and report.html go into (accelerate's project_dir).
inline constexpr const char kLogWith[] = "CXXLAUNCH_LOG_WITH";
inline constexpr const char kProjectDir[] = "CXXLAUNCH_PROJECT_DIR";
// true: saveState / saveCheckpoint snapshot the state and write it in the background.
inline constexpr const char kCheckpointAsync[] = "CXXLAUNCH_CHECKPOINT_ASYNC";
inline constexpr const char kDebug[] = "CXXLAUNCH_DEBUG";  // true: check collectives' shapes
// Always set: the file whose time the runtime touches at every micro-step, so that the launcher
// sees a worker that stops making progress (`cxxlaunch status`, --watchdog_timeout).
inline constexpr const char kHeartbeatFile[] = "CXXLAUNCH_HEARTBEAT_FILE";
// Not set by the launcher: seconds a collective may take before it fails (default 300).
inline constexpr const char kCollectiveTimeout[] = "CXXLAUNCH_COLLECTIVE_TIMEOUT";
inline constexpr const char kZero3Save16BitModel[] =
    "CXXLAUNCH_ZERO3_SAVE_16BIT_MODEL";  // true: ZeRO-3 saves a gathered 16-bit model
inline constexpr const char kZero3InitFlag[] = "CXXLAUNCH_ZERO3_INIT_FLAG";  // true: build sharded
// FSDP only (set when CXXLAUNCH_STRATEGY is fsdp_*), accelerate's values as in the file:
inline constexpr const char kFsdpAutoWrapPolicy[] =
    "CXXLAUNCH_FSDP_AUTO_WRAP_POLICY";  // TRANSFORMER_BASED_WRAP | SIZE_BASED_WRAP | NO_WRAP
inline constexpr const char kFsdpTransformerLayerClsToWrap[] =
    "CXXLAUNCH_FSDP_TRANSFORMER_LAYER_CLS_TO_WRAP";  // module names, comma-separated
inline constexpr const char kFsdpMinNumParams[] =
    "CXXLAUNCH_FSDP_MIN_NUM_PARAMS";  // parameters per unit, SIZE_BASED_WRAP
inline constexpr const char kFsdpBackwardPrefetch[] =
    "CXXLAUNCH_FSDP_BACKWARD_PREFETCH";  // BACKWARD_PRE | BACKWARD_POST | NO_PREFETCH
inline constexpr const char kFsdpForwardPrefetch[] =
    "CXXLAUNCH_FSDP_FORWARD_PREFETCH";  // true | false
inline constexpr const char kFsdpSyncModuleStates[] =
    "CXXLAUNCH_FSDP_SYNC_MODULE_STATES";  // true: broadcast rank 0's weights
inline constexpr const char kFsdpActivationCheckpointing[] =
    "CXXLAUNCH_FSDP_ACTIVATION_CHECKPOINTING";  // true | false
inline constexpr const char kFsdpCpuRamEfficientLoading[] =
    "CXXLAUNCH_FSDP_CPU_RAM_EFFICIENT_LOADING";  // true: build sharded (as kZero3InitFlag)

// Not a variable: the names of the runtime's shared-memory segments in /dev/shm start with this
// and the creating worker's pid ("cxxlaunch-<pid>-..."), so that the launcher can remove what a
// worker killed mid-setup left behind (runtime/comm/shm_collectives.h).
inline constexpr const char kShmNamePrefix[] = "cxxlaunch-";

}  // namespace cxxlaunch::env
