#pragma once
// The checkpoint's schema: every name a checkpoint records its contents under, in one place. The
// format (runtime/checkpoint/shard_file.h, manifest.h) says how bytes are laid out; these names
// say what they mean, and every writer and reader of a checkpoint (the Accelerator, the
// strategies, the reader's checks, `cxxlaunch merge-weights`) takes them from here. Renaming one
// breaks every checkpoint saved before: they are the on-disk contract, as PyTorch DCP's
// state-dict keys are.
//
//   counters  text key -> text value, in the manifest and in each rank file's counters blob; the
//             same on every rank
//   blobs     bytes by name in a rank file (rank 0's for what every rank holds alike)
//   arrays    a parameter's float32 arrays by name, in a rank file's slices (state_view.h)
//
// No LibTorch: the launcher's merge-weights reads checkpoints with it.

#include <cstddef>
#include <string>

namespace cxxlaunch::tensorfile {

// ---- Counters ----

// The job's position: every rank file records them as the manifest does, and a load refuses a
// rank file whose position differs (a file from another save).
inline constexpr char kOptimizerStepsCounter[] = "optimizer_steps";
inline constexpr char kMicroStepCounter[] = "micro_step";
inline constexpr char kSchedulerStepsCounter[] = "scheduler_steps";
inline constexpr const char* kPositionCounters[] = {kOptimizerStepsCounter, kMicroStepCounter,
                                                    kSchedulerStepsCounter};

// What saved it, for people reading a manifest: the strategy's and the precision's names.
inline constexpr char kStrategyCounter[] = "strategy";
inline constexpr char kMixedPrecisionCounter[] = "mixed_precision";

// The optimizer's parameter groups and each one's learning rate ("lr:<group>", 17 digits), as
// its state_dict keeps them.
inline constexpr char kLrGroupsCounter[] = "lr_groups";
inline std::string lrCounter(size_t group) { return "lr:" + std::to_string(group); }

// The fp16 loss scaler's state (LossScaler::save).
inline constexpr char kLossScalerCounter[] = "loss_scaler";

// A torch optimizer's step count of one parameter where it differs from optimizer_steps (a
// parameter that missed steps).
inline std::string stepCounter(const std::string& param) { return "step:" + param; }

// The model folder the saved job loaded (Accelerator::loadModel), encoded by encodeCounterValue
// (manifest.h); merge-weights copies that folder's config and tokenizer files.
inline constexpr char kModelSourceCounter[] = "model_source";
// What a checkpoint of a run whose frozen parameters came from loadModel (a LoRA run's base)
// records instead of them: the base's fingerprint (SafetensorsReader::fingerprint), its folder
// being model_source. Such a checkpoint holds the trainable parameters and their optimizer state
// only; a load checks that the base loaded now has this fingerprint.
inline constexpr char kBaseFingerprintCounter[] = "base_fingerprint";

// A model buffer's layout, "<safetensors dtype>:<d0>,<d1>,...", beside its bytes (bufferBlob),
// so that merge-weights writes it as a tensor. Counter and blob share the name.
inline constexpr char kBufferPrefix[] = "buffer:";
inline std::string bufferCounter(const std::string& buffer) { return kBufferPrefix + buffer; }

// ---- Blobs ----

// The counters of the save, in every rank file (countersText, manifest.h).
inline constexpr char kCountersBlob[] = "counters";
// Each rank's random generators: the CPU's, and the GPU's of a GPU worker.
inline constexpr char kCpuGeneratorBlob[] = "rng_cpu";
inline constexpr char kCudaGeneratorBlob[] = "rng_cuda";
// A model buffer's bytes, in rank 0's file.
inline std::string bufferBlob(const std::string& buffer) { return kBufferPrefix + buffer; }

// ---- Arrays ----

// A parameter's fp32 values.
inline constexpr char kParamArray[] = "param";
// The optimizer's state, under torch::optim's names, whichever strategy holds it: a checkpoint
// of DDP's torch optimizer loads into ZeRO's sharded one and back. Adam and AdamW: exp_avg,
// exp_avg_sq and (amsgrad) max_exp_avg_sq; SGD: momentum_buffer; RMSprop: square_avg,
// momentum_buffer and (centered) grad_avg; Adagrad: sum.
inline constexpr char kExpAvgArray[] = "exp_avg";
inline constexpr char kExpAvgSqArray[] = "exp_avg_sq";
inline constexpr char kMaxExpAvgSqArray[] = "max_exp_avg_sq";
inline constexpr char kMomentumBufferArray[] = "momentum_buffer";
inline constexpr char kSquareAvgArray[] = "square_avg";
inline constexpr char kGradAvgArray[] = "grad_avg";
inline constexpr char kSumArray[] = "sum";

}  // namespace cxxlaunch::tensorfile
