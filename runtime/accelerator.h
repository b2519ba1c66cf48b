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
// environment the launcher sets (docs/env.md); AcceleratorOptions can override them.
// The strategy (DDP, ZeRO-1/2/3, FSDP: docs/sharding.md) is the launch's choice; the only
// thing a trainer does for it is to run its big repeated blocks through unitForward
// (runtime/strategy/unit.h), which is a plain forward call unless parameters are sharded at rest.
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
#include "runtime/env.h"
#include "runtime/reports.h"
#include "runtime/strategy/unit.h"

namespace cxxlaunch::tensorfile {
class Reader;  // a checkpoint file (tensorfile/), read behind the facade
}  // namespace cxxlaunch::tensorfile

namespace cxxlaunch::runtime {

// The engine behind the facade: never needed to train (runtime/world.h, comm/backend.h).
struct World;
class Backend;

// Learning-rate schedules with warmup, stepped once per optimizer step (not per micro-step):
// constant, linear decay to zero, and cosine decay to zero, each after `warmup_steps` of linear
// warmup from zero — the formulas of transformers' get_{constant,linear,cosine}_schedule_with_
// warmup. Scales the lr each parameter group had at construction.
class LrScheduler {
 public:
  enum class Kind { kConstant, kLinear, kCosine };
  // Throws InvalidArgument for negative steps or warmup beyond the total.
  LrScheduler(torch::optim::Optimizer& optimizer, Kind kind, int64_t warmup_steps,
              int64_t total_steps);

  // "constant", "linear", "cosine".
  static Kind parse(const std::string& name);

  void step();            // after each optimizer step
  double factor() const;  // of the base lr, at the current step
  int64_t stepCount() const { return step_; }
  int64_t totalSteps() const { return total_; }
  void setStepCount(int64_t steps);  // a resumed run's; sets the lr for it

 private:
  void apply();

  torch::optim::Optimizer& optimizer_;
  Kind kind_;
  int64_t warmup_;
  int64_t total_;
  int64_t step_ = 0;
  std::vector<double> base_lrs_;
};

// EpochSampler: the sampler of Accelerator::prepareDataLoader. LibTorch's
// DistributedRandomSampler (each rank a disjoint share of one shuffled order, the same on every
// rank), reshuffled at the start of each epoch with the epoch as its seed, as PyTorch's
// DistributedSampler after set_epoch(epoch): every epoch has its own order, the same on every
// rank and in every run. The epoch a loader starts next lives in `next_epoch`, which the loader
// that owns this sampler shares (PreparedDataLoader::setEpoch, and a resumed run's position).
class EpochSampler final : public torch::data::samplers::Sampler<> {
 public:
  EpochSampler(size_t examples, size_t replicas, size_t rank, std::shared_ptr<size_t> next_epoch)
      : inner_(examples, replicas, rank, /*allow_duplicates=*/true),
        next_epoch_(std::move(next_epoch)) {}

  // A DataLoader calls this as each epoch begins.
  void reset(torch::optional<size_t> new_size = torch::nullopt) override {
    inner_.set_epoch((*next_epoch_)++);
    inner_.reset(new_size);
  }
  torch::optional<std::vector<size_t>> next(size_t batch_size) override {
    return inner_.next(batch_size);
  }
  void save(torch::serialize::OutputArchive& archive) const override { inner_.save(archive); }
  void load(torch::serialize::InputArchive& archive) override { inner_.load(archive); }

 private:
  torch::data::samplers::DistributedRandomSampler inner_;
  std::shared_ptr<size_t> next_epoch_;
};

// The evaluation data loader of Accelerator::prepareEvalDataLoader (accelerate's prepared
// DataLoader with even_batches): the dataset in order, in batches of `batch_size` per process,
// every rank the same number of full batches. Batch k of rank r holds the examples
// [(k * world + r) * batch_size, ... + batch_size), so that gathering batch k from every rank
// (rank order) gives the dataset's next world * batch_size examples in order; the examples
// past the end are the first ones again (padding). The loop's position is shared with the
// Accelerator (EvalPosition), whose gatherForMetrics drops the padding of the last batch.
//
// Where the evaluation loop that began last is.
struct EvalPosition {
  int64_t batch = -1;  // the batch its loop is at; -1: none begun; `batches`: past the end
  int64_t batches = 0;
  size_t batch_size = 0;
  size_t last_batch_examples = 0;  // the real examples of the last batch, over all ranks
};

class EvalSampler final : public torch::data::samplers::Sampler<> {
 public:
  EvalSampler(size_t examples, size_t world, size_t rank, size_t batch_size);
  void reset(torch::optional<size_t> = torch::nullopt) override { next_ = 0; }
  torch::optional<std::vector<size_t>> next(size_t batch_size) override;
  void save(torch::serialize::OutputArchive&) const override {}
  void load(torch::serialize::InputArchive&) override {}

  // Batches per rank: ceil(examples / (world * batch_size)).
  static int64_t batchesOf(size_t examples, size_t world, size_t batch_size);

 private:
  std::vector<size_t> indices_;  // this rank's, batch after batch
  size_t next_ = 0;
};

// LibTorch's iterator, moving the shared position as it goes.
template <typename Inner>
class EvalIterator {
 public:
  EvalIterator(Inner inner, EvalPosition* position)
      : inner_(std::move(inner)), position_(position) {}
  decltype(auto) operator*() { return *inner_; }
  auto operator->() { return inner_.operator->(); }
  EvalIterator& operator++() {
    ++inner_;
    if (position_) ++position_->batch;
    return *this;
  }
  bool operator==(const EvalIterator& other) const { return inner_ == other.inner_; }
  bool operator!=(const EvalIterator& other) const { return !(*this == other); }

 private:
  Inner inner_;
  EvalPosition* position_;
};

template <typename Loader>
class PreparedEvalDataLoader {
 public:
  PreparedEvalDataLoader(std::unique_ptr<Loader> loader, std::shared_ptr<EvalPosition> shared,
                         EvalPosition mine)
      : loader_(std::move(loader)), shared_(std::move(shared)), mine_(mine) {}
  // Starts a pass over the dataset: gatherForMetrics follows this loop from here on.
  auto begin() {
    *shared_ = mine_;
    shared_->batch = 0;
    return EvalIterator<decltype(loader_->begin())>(loader_->begin(), shared_.get());
  }
  auto end() { return EvalIterator<decltype(loader_->end())>(loader_->end(), nullptr); }
  int64_t batchesPerProcess() const { return mine_.batches; }
  Loader& torchLoader() { return *loader_; }

 private:
  std::unique_ptr<Loader> loader_;
  std::shared_ptr<EvalPosition> shared_;
  EvalPosition mine_;
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

  int rank() const;
  int localRank() const;
  int worldSize() const;
  bool isMainProcess() const { return rank() == 0; }
  bool isLocalMainProcess() const { return localRank() == 0; }
  int gradientAccumulationSteps() const;
  const WorkerEnv& env() const;
  // The collectives' backend (runtime/comm/backend.h, not installed): for the runtime's tools.
  Backend& backend();
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
  // (DeferredInit in runtime/strategy/unit.h). Off, it changes nothing.
  //
  //   { auto deferred = acc.deferredInit(); model = LlamaForCausalLM(config); }
  DeferredInit deferredInit() const;

  // Recomputes `block`'s activations in backward instead of keeping them (in every strategy),
  // when it runs through unitForward. The config's fsdp_activation_checkpointing does this for
  // every shard unit (or, where nothing is sharded at rest, for the modules that would be).
  void checkpointActivations(const torch::nn::Module& block, bool on = true);

  // Moves `model` to device() and makes it data-parallel with the configured strategy, and
  // remembers the optimizer and scheduler that step() drives (a sharded strategy runs the
  // optimizer's update on its shards). Batches are the trainer's to move: `x.to(acc.device())`.
  // With mixed precision, the calling thread's forward passes run under autocast from here on
  // (docs/runtime.md). Throws InvalidArgument for what this build cannot run, saying what to
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
  bool stepWasSkipped() const;
  // The current loss scale; 1 without loss scaling.
  double lossScale() const;
  const PrecisionPolicy& precision() const;

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
  // A data loader over `dataset` in order (PreparedEvalDataLoader above): every rank the same
  // number of full batches of `batch_size`, the last ones padded with the dataset's first examples.
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
    return std::make_unique<PreparedEvalDataLoader<Loader>>(std::move(loader), evalPosition(),
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
  const std::vector<std::string>& trackerNames() const;
  // Where the report is (<project_dir>/report.html) once initTrackers ran; "" otherwise.
  std::string reportPath() const;

  // Prints on the main process only, one line.
  template <typename... Parts>
  void print(const Parts&... parts) const {
    if (!isMainProcess()) return;
    std::ostringstream line;
    (line << ... << parts);
    std::cout << line.str() << std::endl;
  }

  // accelerate's save_state / load_state (docs/checkpoints.md): the parameters,
  // the optimizer state, the step counters, the LR schedule's position, the loss scaler and
  // every rank's random generator, into the directory `dir` (crash-safe; each rank writes its
  // own file, the manifest last). Collectives: every rank calls them. loadState takes a
  // checkpoint directory or a folder of them (the newest complete one wins), saved by any
  // strategy at any world size, and returns the directory it loaded. Call both after step().
  //
  // With checkpoint_async, saveState returns once this rank's state is copied into host memory
  // and a background thread writes it (docs/checkpoints.md); the checkpoint is complete once
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
  std::vector<checkpoint::SaveReport> takeSaveReports();

  // accelerate's save_model (unwrap_model + save_pretrained): the whole model — parameters in
  // `dtype`, gathered one unit at a time, and buffers — as safetensors in `dir`, for other tools
  // (safetensors), split into files of at most `max_file_bytes`. Without `dtype`:
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
  // (docs/finetune.md). When loadModel gave them their values, the checkpoints
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
  const std::string& checkpointDir() const;

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

  int64_t optimizerSteps() const;
  // Micro-steps (backward + step calls) so far, a resumed run's included: how many batches a
  // data loader has given, so that a resumed run can skip to where it was.
  int64_t microSteps() const;

 private:
  void checkpointUnits();                              // fsdp_activation_checkpointing
  void restoreFrom(const tensorfile::Reader& reader);  // loadState's work, from one checkpoint
  void committed(checkpoint::SaveReport report);       // a save's report; saveCheckpoint's pruning
  void reserveSnapshot();  // checkpoint_async: the snapshot made in the background
  // Whether checkpoints name the base instead of holding the frozen parameters.
  bool baseByReference() const;
  // Why checkpoint `reader` cannot load over the base loaded now (empty: it can).
  std::string baseMismatch(const tensorfile::Reader& reader) const;

  struct Impl;  // runtime/accelerator_impl.h: the engine and the run's state
  std::shared_ptr<EvalPosition> evalPosition() const;  // where prepared evaluation loops are

  std::unique_ptr<Impl> impl_;
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
