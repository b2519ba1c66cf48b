#pragma once
// Accelerator: what a trainer sees, after HuggingFace accelerate. The same trainer runs as one
// process or as many, on one node or several: only the launch (and its config) changes.
//
//   cxxlaunch::runtime::Accelerator acc;              // reads the launcher's environment
//   acc.prepare(model, optimizer, &scheduler);          // DDP, initial state from rank 0
//   auto loader = acc.prepareDataLoader(dataset, per_device_batch_size);
//   for (auto& batch : *loader) {
//     auto loss = torch::mse_loss(model->forward(batch.data), batch.target);
//     acc.backward(loss);                               // accumulation-aware
//     if (acc.step()) acc.print("loss ", loss.item<double>());   // true after an optimizer step
//   }
//
// Settings (strategy, gradient accumulation, clipping, mixed precision, backend) come from the
// environment the launcher sets (common/env_names.h); AcceleratorOptions can override them.
// The strategy (DDP, ZeRO-1/2/3, FSDP: strategy/strategy.h) is the launch's choice; the only
// thing a trainer does for it is to run its big repeated blocks through unitForward
// (strategy/unit.h), which is a plain forward call unless parameters are sharded at rest.
// Rank-0 helpers (print, isMainProcess, mainProcessFirst) make rank-0 I/O the easy path.
//
// Thread-safety: one training thread.

#include <torch/data.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "common/error.h"
#include "runtime/deferred_init.h"
#include "runtime/epoch_sampler.h"
#include "runtime/precision/loss_scaler.h"
#include "runtime/precision/policy.h"
#include "runtime/scheduler.h"
#include "runtime/strategy/strategy.h"
#include "runtime/strategy/unit.h"
#include "runtime/world.h"

namespace cxxlaunch::runtime {

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
  // saveCheckpoint keeps the newest this many (accelerate's total_limit); 0: all of them.
  // Unset: the launch's (--checkpoint_total_limit, CXXLAUNCH_CHECKPOINT_TOTAL_LIMIT,
  // cxxlaunch.checkpoint_total_limit), else 0.
  std::optional<int64_t> checkpoint_total_limit;
};

class Accelerator;

// What prepareDataLoader returns: LibTorch's loader, reshuffled each epoch (EpochSampler) and
// resumed where a loaded checkpoint was.
template <typename Loader>
class PreparedDataLoader {
 public:
  PreparedDataLoader(std::unique_ptr<Loader> loader, Accelerator& acc, int64_t batches,
                     std::shared_ptr<size_t> next_epoch, size_t padding)
      : loader_(std::move(loader)),
        acc_(acc),
        batches_(batches),
        next_epoch_(std::move(next_epoch)),
        padding_(padding) {}
  // Starts an epoch: epochs 0, 1, 2, ... in turn, each in its own order.
  auto begin();
  auto end() { return loader_->end(); }
  int64_t batchesPerEpoch() const { return batches_; }
  // The epoch the next begin() starts (PyTorch's sampler.set_epoch: to pick one by hand).
  size_t nextEpoch() const { return *next_epoch_; }
  void setEpoch(size_t epoch) { *next_epoch_ = epoch; }
  // Examples that appear twice in each epoch, over all ranks: the sampler gives every rank
  // ceil(examples / world), repeating the first ones of the order to fill the last shares (as
  // PyTorch's DistributedSampler). Accelerator::gather of a whole epoch's results holds them
  // too: drop this many of the last batch's gathered rows for exact metrics.
  size_t paddingExamples() const { return padding_; }
  Loader& torchLoader() { return *loader_; }

 private:
  std::unique_ptr<Loader> loader_;
  Accelerator& acc_;
  int64_t batches_;
  std::shared_ptr<size_t> next_epoch_;
  size_t padding_;
};

class Accelerator {
 public:
  // Reads the launcher's environment and connects to the other ranks.
  explicit Accelerator(AcceleratorOptions options = {});
  // Over a given world (tests run ranks as threads over the Fake backend).
  Accelerator(World world, AcceleratorOptions options);
  ~Accelerator();

  int rank() const { return world_.env.rank; }
  int localRank() const { return world_.env.local_rank; }
  int worldSize() const { return world_.env.world_size; }
  bool isMainProcess() const { return rank() == 0; }
  bool isLocalMainProcess() const { return localRank() == 0; }
  int gradientAccumulationSteps() const { return accumulation_steps_; }
  const WorkerEnv& env() const { return world_.env; }
  Backend& backend() { return *world_.backend; }
  // Where this worker trains: its GPU when the backend is NCCL, the CPU otherwise.
  torch::Device device() const;

  // Marks `unit` as a shard unit (before prepare), whatever the config's wrap policy: under
  // ZeRO-3 / FULL_SHARD its parameters are gathered only around its unitForward calls. A no-op
  // under the other strategies.
  void wrap(const torch::nn::Module& unit);

  // DeepSpeed's zero.Init / FSDP's meta-device init, on when the config asks for it
  // (deepspeed_config.zero3_init_flag, fsdp_config.fsdp_cpu_ram_efficient_loading): models/
  // built while the scope lives take no memory for their parameters until prepare, which under
  // ZeRO-3 / FULL_SHARD makes them one unit at a time, keeping this rank's shards
  // (runtime/deferred_init.h). Off, it changes nothing.
  //
  //   { auto deferred = acc.deferredInit(); model = LlamaForCausalLM(config); }
  DeferredInit deferredInit() const {
    return DeferredInit(world_.env.zero3_init_flag || world_.env.fsdp_cpu_ram_efficient_loading);
  }

  // Recomputes `block`'s activations in backward instead of keeping them (in every strategy),
  // when it runs through unitForward. The config's fsdp_activation_checkpointing does this for
  // every shard unit (or, where nothing is sharded at rest, for the modules that would be).
  void checkpointActivations(const torch::nn::Module& block, bool on = true);

  // Moves `model` to device() and makes it data-parallel with the configured strategy, and
  // remembers the optimizer and scheduler that step() drives (a sharded strategy runs the
  // optimizer's update on its shards). Batches are the trainer's to move: `x.to(acc.device())`.
  // With mixed precision, the calling thread's forward passes run under autocast from here on
  // (precision/policy.h). Throws InvalidArgument for what this build cannot run, saying what to
  // change.
  void prepare(std::shared_ptr<torch::nn::Module> model, torch::optim::Optimizer& optimizer,
               LrScheduler* scheduler = nullptr);

  // A data loader over this rank's share of `dataset` (EpochSampler: shuffled, disjoint across
  // ranks, another order each epoch): `batch_size` examples per process per micro-step. Iterate
  // it as LibTorch's (`for (auto& batch : *loader)`); each loop is one epoch. It resumes where a
  // saved run was: the first loader iterated after loadState (or resume) starts at the saved
  // run's epoch (microSteps() / the batches of an epoch) and skips the batches of it that run
  // had drawn, so a resumed run sees exactly the batches the uninterrupted one would have.
  template <typename Dataset>
  auto prepareDataLoader(Dataset dataset, size_t batch_size) {
    requireBatchSize(batch_size);
    const auto size = dataset.size();  // LibTorch's optional (c10::optional in 1.13)
    if (!size) throw InvalidArgument("prepareDataLoader: the dataset has no size() to shard by");
    const size_t examples = *size, world = static_cast<size_t>(worldSize());
    auto next_epoch = std::make_shared<size_t>(0);
    EpochSampler sampler(examples, world, static_cast<size_t>(rank()), next_epoch);
    // The sampler gives each rank ceil(examples / world) of them; the last batch may be short.
    const size_t mine = (examples + world - 1) / world;
    const auto batches = static_cast<int64_t>((mine + batch_size - 1) / batch_size);
    auto loader = torch::data::make_data_loader(std::move(dataset), std::move(sampler),
                                                torch::data::DataLoaderOptions(batch_size));
    using Loader = typename decltype(loader)::element_type;
    return std::make_unique<PreparedDataLoader<Loader>>(
        std::move(loader), *this, batches, std::move(next_epoch), mine * world - examples);
  }
  // InvalidArgument naming the argument for a batch of 0 examples.
  static void requireBatchSize(size_t batch_size);
  // The micro-steps of a loaded run, once, for the first loader that begins after the load.
  std::optional<int64_t> takeResumePosition();

  // loss.backward() for this micro-step: the loss is divided by the accumulation steps, and
  // gradients are only synchronised on the last micro-step of each accumulation cycle.
  // Each backward wants its step(): a second backward without one throws InvalidArgument (the
  // optimizer's own step() is not a substitute: under ZeRO-2/3 and FSDP it finds no gradients,
  // and it never advances the schedule). Several losses in one step: backward their sum.
  void backward(const torch::Tensor& loss);

  // Whether the current micro-step ends an accumulation cycle (gradients are synchronised).
  bool syncGradients() const;

  // At the end of an accumulation cycle: clip (if configured), optimizer step, scheduler step,
  // zero the gradients, and return true. Otherwise only count the micro-step; return false.
  // With loss scaling, a cycle whose gradients overflowed (on any rank) skips the optimizer and
  // scheduler steps on every rank, still returning true; stepWasSkipped() tells.
  bool step();
  bool stepWasSkipped() const { return step_was_skipped_; }
  // The current loss scale; 1 without loss scaling.
  double lossScale() const { return scaler_ ? scaler_->scale() : 1.0; }
  const PrecisionPolicy& precision() const { return precision_; }

  // accelerate's accumulate(): runs one micro-step (`micro_step` returns the loss), then step().
  bool accumulate(const std::function<torch::Tensor()>& micro_step);

  // Scales the gradients so their global L2 norm is at most `max_norm`; returns the norm before.
  double clipGradNorm(double max_norm);

  void waitForEveryone();

  // Runs `work` on the main process first, then on the others (downloads, caches, datasets).
  void mainProcessFirst(const std::function<void()>& work);

  // Every rank's `tensor` concatenated along dim 0, in rank order (same shape on every rank).
  // Gathered results of a prepared loader's last batch hold its padding duplicates
  // (PreparedDataLoader::paddingExamples).
  torch::Tensor gather(const torch::Tensor& tensor);

  // Prints on the main process only, one line.
  template <typename... Parts>
  void print(const Parts&... parts) const {
    if (!isMainProcess()) return;
    std::ostringstream line;
    (line << ... << parts);
    std::cout << line.str() << std::endl;
  }

  // accelerate's save_state / load_state (runtime/checkpoint/checkpoint.h): the parameters,
  // the optimizer state, the step counters, the LR schedule's position, the loss scaler and
  // every rank's random generator, into the directory `dir` (crash-safe; each rank writes its
  // own file, the manifest last). Collectives: every rank calls them. loadState takes a
  // checkpoint directory or a folder of them (the newest complete one wins), saved by any
  // strategy at any world size, and returns the directory it loaded. Call both after step().
  void saveState(const std::string& dir);
  std::string loadState(const std::string& path);

  // accelerate's save_model (unwrap_model + save_pretrained): the whole model — parameters in
  // `dtype`, gathered one unit at a time, and buffers — as safetensors in `dir`, for other tools
  // (checkpoint/safetensors.h), split into files of at most `max_file_bytes`. Without `dtype`:
  // fp32, or 16-bit weights where the config asks for them (DeepSpeed's zero3_save_16bit_model:
  // the mixed precision's dtype, bf16 without one). Rank 0 writes; a collective. loadModel reads
  // such an export (or another tool's) into the model, every rank, casting to the parameters'
  // dtype; the optimizer state starts afresh. Throws InvalidArgument for a file that is corrupt
  // or, listing the names, holds another model's tensors.
  void saveModel(const std::string& dir, uint64_t max_file_bytes = 5'000'000'000ull,
                 std::optional<c10::ScalarType> dtype = std::nullopt);
  void loadModel(const std::string& dir);

  // Rank-0 I/O: accelerate's save. On the main process only (the others return at once; no
  // collective), `bytes` or named `tensors` (as one safetensors file) to `path`, atomically:
  // written under a temporary name, fsynced, renamed. Everything a trainer writes besides
  // checkpoints (metrics, samples, configs) should go through it: writing from every rank is
  // the hard path.
  void save(const std::string& path, const std::string& bytes) const;
  void save(const std::string& path,
            const std::vector<std::pair<std::string, torch::Tensor>>& tensors) const;

  // With a checkpoint folder configured (--checkpoint_dir, CXXLAUNCH_CHECKPOINT_DIR, the
  // config's cxxlaunch.checkpoint_dir, or AcceleratorOptions): saveCheckpoint saves into
  // <folder>/checkpoint_<optimizer steps> and removes the oldest beyond checkpoint_total_limit
  // (never the newest complete one); resume loads the folder's newest complete checkpoint if
  // there is one (a restarted or re-formed job) and returns it. Both are collectives; without a
  // folder saveCheckpoint throws InvalidArgument and resume returns nullopt.
  //
  //   if (auto from = acc.resume()) acc.print("resumed from ", *from);
  //   ... if (acc.step() && acc.optimizerSteps() % 100 == 0) acc.saveCheckpoint();
  std::string saveCheckpoint();
  std::optional<std::string> resume();
  const std::string& checkpointDir() const { return checkpoint_dir_; }

  // Model-state bytes this rank holds now (parameters, gradients, optimizer state).
  MemoryReport memoryReport() const;
  // "zero3: 3 unit(s) (2 module(s), 1 bucket(s)), AdamW on 1/2 shards"
  std::string describeStrategy() const;
  // A collective: every trainable parameter, whole, by name (gathered from shards).
  std::vector<std::pair<std::string, torch::Tensor>> fullParameters();

  // "global batch 64 = 16 per process x 2 processes x 2 accumulation steps"
  std::string describeBatch(size_t per_process_batch) const;

  // Progress on the launcher's console and in `cxxlaunch status` (docs/observability.md), as
  // tqdm's total= and set_postfix(loss=...): the training steps the run takes (step() calls that
  // return true; default: the total of the scheduler given to prepare; 0: unknown), and the
  // latest loss. Local and cheap (no collective: the next heartbeat carries them); the launcher
  // shows the lowest rank's loss that has one.
  void setTotalSteps(int64_t steps);
  void setProgressLoss(double loss);

  int64_t optimizerSteps() const { return optimizer_steps_; }
  // Micro-steps (backward + step calls) so far, a resumed run's included: how many batches a
  // data loader has given, so that a resumed run can skip to where it was.
  int64_t microSteps() const { return micro_step_; }

 private:
  void checkpointUnits(const torch::nn::Module& model);  // fsdp_activation_checkpointing
  void restoreFrom(const checkpoint::Reader& reader);    // loadState's work, from one checkpoint

  World world_;
  int accumulation_steps_ = 1;
  double clipping_ = 0;
  size_t bucket_bytes_;
  bool find_unused_;
  LrScheduler* scheduler_ = nullptr;
  torch::optim::Optimizer* optimizer_ = nullptr;  // the trainer's, from prepare on
  std::shared_ptr<torch::nn::Module> model_;      // its buffers go into checkpoints
  std::string checkpoint_dir_;
  int64_t checkpoint_total_limit_ = 0;
  std::vector<const torch::nn::Module*> wrapped_;
  std::vector<const torch::nn::Module*> checkpointed_;  // unmarked when this ends
  PrecisionPolicy precision_;
  std::optional<LossScaler> scaler_;
  std::unique_ptr<AutocastScope> autocast_;  // from prepare on, with mixed precision
  bool step_was_skipped_ = false;
  std::unique_ptr<Strategy> strategy_;
  int64_t micro_step_ = 0;
  int64_t optimizer_steps_ = 0;
  bool backward_pending_ = false;  // a backward() that no step() followed yet
  std::optional<int64_t>
      resume_position_;  // micro-steps of the loaded run, until a loader takes them
};

template <typename Loader>
auto PreparedDataLoader<Loader>::begin() {
  int64_t skip = 0;
  if (const auto position = acc_.takeResumePosition(); position && batches_ > 0) {
    *next_epoch_ = static_cast<size_t>(*position / batches_);
    skip = *position % batches_;
  }
  auto it = loader_->begin();
  for (; skip > 0 && it != loader_->end(); --skip) ++it;
  return it;
}

}  // namespace cxxlaunch::runtime
