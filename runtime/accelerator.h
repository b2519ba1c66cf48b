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

#include <algorithm>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "runtime/checkpoint/save_report.h"
#include "runtime/deferred_init.h"
#include "runtime/epoch_sampler.h"
#include "runtime/eval_loader.h"
#include "runtime/memory_report.h"
#include "runtime/observability/trackers.h"
#include "runtime/precision/loss_scaler.h"
#include "runtime/precision/policy.h"
#include "runtime/scheduler.h"
#include "runtime/strategy/unit.h"
#include "runtime/world.h"

// The engine and the file format stay behind the facade.
namespace cxxlaunch::tensorfile {
class Reader;
}  // namespace cxxlaunch::tensorfile

namespace cxxlaunch::runtime {

class Strategy;
namespace checkpoint {
class AsyncSaver;
}  // namespace checkpoint

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
  // and pruning find both (checkpoint/manifest.h). Anything else is InvalidArgument.
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
  // The same for a module holder, returning the unit's handle: calling it is unitForward.
  //   auto unit = acc.wrap(block);  ...  x = unit(x);
  template <TorchModuleHolder ModuleHolder>
  Unit<ModuleHolder> wrap(ModuleHolder block) {
    wrap(*block);
    return Unit<ModuleHolder>(std::move(block));
  }

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

  // Evaluation (accelerate's evaluation loop), collectives where they say so.
  //
  //   auto loader = acc.prepareEvalDataLoader(dataset, 16);
  //   for (auto& batch : *loader) {
  //     auto predictions = acc.gatherForMetrics(model->forward(batch.data).argmax(1));
  //     auto labels = acc.gatherForMetrics(batch.target);  // both: exactly the dataset's rows
  //   }
  //
  // A data loader over `dataset` in order (runtime/eval_loader.h): every rank the same number
  // of full batches of `batch_size`, the last ones padded with the dataset's first examples.
  template <typename Dataset>
  auto prepareEvalDataLoader(Dataset dataset, size_t batch_size) {
    requireBatchSize(batch_size);
    const auto size = dataset.size();
    if (!size) throw InvalidArgument("prepareEvalDataLoader: the dataset has no size() to split");
    const size_t examples = *size, world = static_cast<size_t>(worldSize());
    EvalPosition mine;
    mine.batches = EvalSampler::batchesOf(examples, world, batch_size);
    mine.batch_size = batch_size;
    mine.last_batch_examples =
        examples - static_cast<size_t>(std::max<int64_t>(mine.batches - 1, 0)) * world * batch_size;
    auto loader = torch::data::make_data_loader(
        std::move(dataset), EvalSampler(examples, world, static_cast<size_t>(rank()), batch_size),
        torch::data::DataLoaderOptions(batch_size));
    using Loader = typename decltype(loader)::element_type;
    return std::make_unique<PreparedEvalDataLoader<Loader>>(std::move(loader), eval_position_,
                                                            mine);
  }
  // gather(), less the padding: within a prepared evaluation loop, the last batch's gathered
  // rows are cut to the dataset's real examples, so the results of the whole loop hold each
  // example once, in the dataset's order. Rows are examples: a tensor whose first dimension is
  // not the batch's is gathered whole. Outside such a loop it is gather(). A collective.
  torch::Tensor gatherForMetrics(const torch::Tensor& tensor);
  // Every rank's `tensor` summed ("sum") or averaged ("mean"), elementwise. A collective.
  torch::Tensor reduce(const torch::Tensor& tensor, const std::string& op = "sum");
  // `tensor` grown along `dim` to the largest size any rank has there, the new entries
  // `pad_index` (at the start with pad_first), so that ranks' results of different lengths can
  // be gathered. A collective.
  torch::Tensor padAcrossProcesses(const torch::Tensor& tensor, int64_t dim = 0,
                                   double pad_index = 0, bool pad_first = false);
  // This rank's contiguous share of `items` (accelerate's split_between_processes): the first
  // items.size() % world ranks get one more. No collective.
  template <typename T>
  std::vector<T> splitBetweenProcesses(const std::vector<T>& items) const {
    const auto [begin, end] = shareOf(items.size());
    return std::vector<T>(items.begin() + static_cast<std::ptrdiff_t>(begin),
                          items.begin() + static_cast<std::ptrdiff_t>(end));
  }
  torch::Tensor splitBetweenProcesses(const torch::Tensor& items) const;  // along dim 0
  // [begin, end) of this rank's share of `count` items.
  std::pair<size_t, size_t> shareOf(size_t count) const;

  // Trackers (accelerate's init_trackers / log / end_training; docs/observability.md). With
  // log_with set, initTrackers opens them on the main process in <project_dir>/<run_name>/ and
  // records `config` with the launch's resolved settings (config.json, report.html); it throws
  // InvalidArgument there, at once, for a project folder that cannot be written. log writes
  // `values` at `step` (default: optimizerSteps()) on the main process; the other processes and
  // a run without log_with return at once; a "loss" among `values` is also the progress line's
  // (setProgressLoss), on every process. endTraining writes the final report (the destructor
  // does, if not called). None of them is a collective.
  //
  //   acc.initTrackers("run1", {{"lr", lr}, {"model", "gpt"}});
  //   if (acc.step()) acc.log({{"loss", loss.item<double>()}, {"lr", scheduler.lr()}});
  void initTrackers(const std::string& run_name, const RunConfig& config = {});
  void log(const Scalars& values, std::optional<int64_t> step = std::nullopt);
  void endTraining();
  // The trackers log() writes to; empty without log_with.
  const std::vector<std::string>& trackerNames() const { return log_with_; }
  // Where the report is (<project_dir>/report.html) once initTrackers ran; "" otherwise.
  std::string reportPath() const { return trackers_ ? trackers_->reportPath() : ""; }

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
  //
  // With checkpoint_async, saveState returns once this rank's state is copied into host memory
  // and a background thread writes it (checkpoint/async_save.h); the checkpoint is complete once
  // committed, at the first step() that finds every rank's write over, or when the next save,
  // loadState, waitForCheckpoint or the end of the Accelerator waits for it. A write that failed
  // is an error on every rank there.
  void saveState(const std::string& dir);
  std::string loadState(const std::string& path);
  // A collective: waits for an asynchronous save in flight and commits it (at once without one).
  void waitForCheckpoint();
  bool checkpointInFlight() const;
  // The saves committed since the last call, oldest first: a synchronous one when saveState
  // returns, an asynchronous one when it was committed (see above). For a trainer's log line.
  std::vector<checkpoint::SaveReport> takeSaveReports() { return std::exchange(save_reports_, {}); }

  // accelerate's save_model (unwrap_model + save_pretrained): the whole model — parameters in
  // `dtype`, gathered one unit at a time, and buffers — as safetensors in `dir`, for other tools
  // (checkpoint/safetensors.h), split into files of at most `max_file_bytes`. Without `dtype`:
  // fp32, or 16-bit weights where the config asks for them (DeepSpeed's zero3_save_16bit_model:
  // the mixed precision's dtype, bf16 without one). Rank 0 writes; a collective. loadModel reads
  // such an export (or another tool's) into the model, every rank, casting to the parameters'
  // dtype; the optimizer state starts afresh. Throws InvalidArgument for a file that is corrupt
  // or, listing the names, holds another model's tensors. The folder it read is recorded in the
  // checkpoints saved after it (and kept by a load of one), so that `cxxlaunch merge-weights`
  // can copy its config.json and tokenizer files.
  //
  // Frozen parameters (requires_grad false before prepare: a LoRA run's base) are held in the
  // mixed precision's dtype, without master, gradient or optimizer state
  // (strategy/frozen_parameters.h). When loadModel gave them their values, the checkpoints
  // saved after it hold the trainable parameters and their optimizer state only, and name the
  // base instead: its folder and fingerprint (SafetensorsReader::fingerprint). Loading such a
  // checkpoint wants the same base loaded first (prepare, loadModel(base), then loadState or
  // resume); InvalidArgument names both when the base loaded differs or none was. Into a model
  // with frozen parameters loadModel loads a base: trainable parameters the export does not hold
  // (the adapters) keep their values, with a note.
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
  // <folder>/checkpoint_<optimizer steps> (or checkpoint-<steps>: checkpoint_prefix) and removes
  // the oldest beyond checkpoint_total_limit (never the newest complete one); resume loads the
  // folder's newest complete checkpoint if there is one (a restarted or re-formed job) and returns
  // it. Both are collectives; without a folder saveCheckpoint throws InvalidArgument and resume
  // returns nullopt.
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
  // A collective: every parameter (frozen ones too), whole, by name (gathered from shards), as
  // float32 copies in host memory whatever the device and precision it trains in; with `keep`,
  // only those whose names it takes are copied (a LoRA adapter's, without a copy of the base).
  std::vector<std::pair<std::string, torch::Tensor>> fullParameters(
      const std::function<bool(const std::string&)>& keep = {});

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
  void restoreFrom(const tensorfile::Reader& reader);    // loadState's work, from one checkpoint
  void committed(checkpoint::SaveReport report);  // a save's report; saveCheckpoint's pruning
  void reserveSnapshot();  // checkpoint_async: the snapshot made in the background
  // Whether checkpoints name the base instead of holding the frozen parameters.
  bool baseByReference() const;
  // Why checkpoint `reader` cannot load over the base loaded now (empty: it can).
  std::string baseMismatch(const tensorfile::Reader& reader) const;

  World world_;
  int accumulation_steps_ = 1;
  double clipping_ = 0;
  size_t bucket_bytes_;
  bool find_unused_;
  LrScheduler* scheduler_ = nullptr;
  torch::optim::Optimizer* optimizer_ = nullptr;  // the trainer's, from prepare on
  std::shared_ptr<torch::nn::Module> model_;      // its buffers go into checkpoints
  std::string checkpoint_dir_;
  std::string checkpoint_prefix_;  // checkpoint_ or checkpoint-
  std::string model_source_;       // the folder loadModel read (absolute), for checkpoints to name
  std::string base_fingerprint_;   // its fingerprint, when it gave frozen parameters their values
  int64_t checkpoint_total_limit_ = 0;
  std::unique_ptr<checkpoint::AsyncSaver> async_saver_;  // with checkpoint_async
  bool prune_when_committed_ = false;                    // the save in flight is saveCheckpoint's
  bool snapshot_reserved_ = false;
  std::vector<checkpoint::SaveReport> save_reports_;
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
  std::shared_ptr<EvalPosition> eval_position_ = std::make_shared<EvalPosition>();
  std::vector<std::string> log_with_;
  std::string project_dir_;
  int report_every_;
  std::unique_ptr<Trackers> trackers_;  // main process, from initTrackers on
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
