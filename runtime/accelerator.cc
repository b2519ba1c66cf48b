#include "runtime/accelerator.h"

#if defined(CXXLAUNCH_TORCH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <utility>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/host.h"
#include "common/tracker_names.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/files.h"
#include "runtime/checkpoint/model_source.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/comm/checked_backend.h"
#include "runtime/comm/tensor_ops.h"
#include "runtime/error_report.h"
#include "runtime/host_memory.h"

namespace cxxlaunch::runtime {
namespace {

WorkerEnv withOverrides(WorkerEnv env, const AcceleratorOptions& options) {
  if (options.gradient_accumulation_steps) {
    env.gradient_accumulation_steps = *options.gradient_accumulation_steps;
  }
  if (options.gradient_clipping) env.gradient_clipping = *options.gradient_clipping;
  if (options.backend) env.backend = *options.backend;
  if (options.mixed_precision) env.mixed_precision = *options.mixed_precision;
  return env;
}

}  // namespace

Accelerator::Accelerator(AcceleratorOptions options)
    : Accelerator(World{withOverrides(readWorkerEnv(), options), nullptr, nullptr, nullptr},
                  options) {}

Accelerator::Accelerator(World world, AcceleratorOptions options)
    : world_(std::move(world)),
      bucket_bytes_(options.bucket_bytes),
      find_unused_(options.find_unused_parameters),
      checkpoint_dir_(options.checkpoint_dir.value_or(world_.env.checkpoint_dir)),
      checkpoint_total_limit_(
          options.checkpoint_total_limit.value_or(world_.env.checkpoint_total_limit)) {
  if (checkpoint_total_limit_ < 0) {
    throw InvalidArgument(
        "AcceleratorOptions::checkpoint_total_limit is negative; give the "
        "number of checkpoints to keep, or 0 for all");
  }
  log_with_ = options.log_with ? parseTrackerList(*options.log_with, "AcceleratorOptions::log_with")
                               : world_.env.log_with;
  project_dir_ = options.project_dir.value_or(world_.env.project_dir);
  report_every_ = options.report_every;
  if (options.checkpoint_async.value_or(world_.env.checkpoint_async)) {
    async_saver_ = std::make_unique<checkpoint::AsyncSaver>();
  }
  installUncaughtErrorReport(world_.env.error_file);
  if (world_.env.gradient_accumulation_steps < 1) {
    throw InvalidArgument("gradient accumulation steps must be >= 1");
  }
  keepFreedHostMemory();
  accumulation_steps_ = world_.env.gradient_accumulation_steps;
  clipping_ = world_.env.gradient_clipping;
  if (!world_.heartbeat) {
    world_.heartbeat = std::make_shared<Heartbeat>(world_.env.heartbeat_file);
  }
  if (!world_.backend) {
    if (!world_.store) world_.store = storeFromEnv(world_.env);
    // As accelerate: a worker that sees a GPU trains on it (over NCCL, with backend auto); the
    // launcher's --cpu hides them (CUDA_VISIBLE_DEVICES empty).
    world_.backend =
        backendFromEnv(world_.env, world_.store, torch::cuda::is_available(), world_.heartbeat);
  }
  precision_ = precisionPolicy(world_.env.mixed_precision, device().type());
  if (precision_.scalesLoss() || options.loss_scaling) {
    scaler_.emplace(options.loss_scaling.value_or(LossScalerOptions{}));
  }
}

Accelerator::~Accelerator() {
  for (const auto* module : checkpointed_) detail::setCheckpointActivations(module, false);
  if (checkpointInFlight()) {
    if (std::uncaught_exceptions() > 0) {
      async_saver_->abandon();  // the other ranks may never come: left incomplete, uncommitted
    } else {
      // The end of training commits the last save; a write that failed ends the process as an
      // uncaught error would (error_report.h), never silently.
      try {
        waitForCheckpoint();
      } catch (...) {
        std::terminate();
      }
    }
  }
  if (backward_pending_ && std::uncaught_exceptions() == 0) {
    std::cerr << "cxxlaunch: warning: the last Accelerator::backward had no Accelerator::step "
                 "after it, so its gradients were never applied (call acc.step() after each "
                 "acc.backward)\n";
  }
}

torch::Device Accelerator::device() const {
  if (world_.backend->name() == "nccl") {
    return {torch::kCUDA, static_cast<c10::DeviceIndex>(world_.env.device.value_or(localRank()))};
  }
  return torch::kCPU;
}

void Accelerator::wrap(const torch::nn::Module& unit) {
  if (strategy_) throw InvalidArgument("Accelerator::wrap after prepare: mark units before it");
  wrapped_.push_back(&unit);
}

void Accelerator::checkpointActivations(const torch::nn::Module& block, bool on) {
  detail::setCheckpointActivations(&block, on);
  if (on) checkpointed_.push_back(&block);
}

void Accelerator::prepare(std::shared_ptr<torch::nn::Module> model,
                          torch::optim::Optimizer& optimizer, LrScheduler* scheduler) {
  const CollectiveApi api("prepare");
  // As accelerate's prepare: the model trains on this worker's device (a GPU under NCCL).
  moveModule(*model, device());
  StrategyOptions options;
  options.bucket_bytes = bucket_bytes_;
  options.find_unused_parameters = find_unused_;
  options.wrapped = wrapped_;
  options.precision = precision_;
  strategy_ = makeStrategy(world_.env, world_.backend, model, optimizer, options);
  scheduler_ = scheduler;
  // The schedule's length is the run's, unless the trainer said otherwise (setTotalSteps).
  if (scheduler_ != nullptr && world_.heartbeat->record().total == 0) {
    world_.heartbeat->setTotalSteps(scheduler_->totalSteps());
  }
  optimizer_ = &optimizer;
  model_ = model;
  if (world_.env.fsdp_activation_checkpointing) checkpointUnits(*model);
  if (precision_.mixed()) {
    autocast_ = std::make_unique<AutocastScope>(device().type(), precision_.compute, true);
  }
}

void Accelerator::checkpointUnits(const torch::nn::Module& model) {
  std::vector<const torch::nn::Module*> blocks = strategy_->unitModules();
  if (blocks.empty()) {  // nothing sharded at rest: the modules that would be units
    blocks = wrapped_;
    for (const auto& module : model.modules(/*include_self=*/false)) {
      for (const auto& wanted : world_.env.fsdp_transformer_layer_cls) {
        if (detail::typeMatches(*module, wanted)) blocks.push_back(module.get());
      }
    }
  }
  if (blocks.empty()) {
    throw InvalidArgument(
        "fsdp_activation_checkpointing is on, but no module is a unit to checkpoint: name the "
        "block type with fsdp_transformer_layer_cls_to_wrap, or mark blocks with "
        "Accelerator::wrap or Accelerator::checkpointActivations");
  }
  for (const auto* block : blocks) checkpointActivations(*block);
}

bool Accelerator::syncGradients() const { return (micro_step_ + 1) % accumulation_steps_ == 0; }

void Accelerator::backward(const torch::Tensor& loss) {
  const CollectiveApi api("backward");
  if (!strategy_) throw InvalidArgument("Accelerator::backward before prepare(model, optimizer)");
  // The trainer that steps its own optimizer instead of acc.step() must hear it at once: under
  // ZeRO-2/3 and FSDP the optimizer's step() finds no gradients (they live in the strategy's
  // shards) and changes nothing, and under every strategy the schedule would not advance.
  if (backward_pending_) {
    throw InvalidArgument(
        "Accelerator::backward was called again without Accelerator::step after the last one: "
        "call acc.step() after each acc.backward(loss), not optimizer.step() (acc.step() steps "
        "the optimizer, which under ZeRO and FSDP runs on the strategy's shards, and the LR "
        "schedule, and counts gradient accumulation). For several losses in one step, call "
        "acc.backward on their sum");
  }
  backward_pending_ = true;
  world_.heartbeat->beat();  // progress, for the launcher's --watchdog_timeout
  const bool sync = syncGradients();
  strategy_->beforeBackward(sync);
  torch::Tensor scaled = accumulation_steps_ > 1 ? loss / accumulation_steps_ : loss;
  if (scaler_) scaled = scaled * scaler_->scale();
  {
    // Backward runs the dtypes its forward chose; autocast is for forward passes only.
    std::optional<AutocastScope> no_autocast;
    if (autocast_) no_autocast.emplace(device().type(), precision_.compute, false);
    scaled.backward();
  }
  strategy_->afterBackward(sync);
}

bool Accelerator::step() {
  const CollectiveApi api("step");
  if (!strategy_) throw InvalidArgument("Accelerator::step before prepare(model, optimizer)");
  backward_pending_ = false;
  if (checkpointInFlight()) {
    if (auto report = async_saver_->poll(*world_.backend)) committed(std::move(*report));
  }
  const bool sync = syncGradients();
  ++micro_step_;
  if (!sync) return false;
  if (scaler_) {
    const bool finite = strategy_->unscaleGradients(1.0 / scaler_->scale());
    scaler_->update(!finite);
    step_was_skipped_ = !finite;
    if (!finite) {
      strategy_->zeroGrad();
      world_.heartbeat->stepDone(micro_step_ / accumulation_steps_, collectiveWaitOnThisThread());
      return true;
    }
  }
  if (clipping_ > 0) clipGradNorm(clipping_);
  strategy_->step();
  if (scheduler_ != nullptr) scheduler_->step();
  strategy_->zeroGrad();
  ++optimizer_steps_;
  if (async_saver_ && !std::exchange(snapshot_reserved_, true)) reserveSnapshot();
  // For the launcher's progress line and straggler check (heartbeat.h).
  world_.heartbeat->stepDone(micro_step_ / accumulation_steps_, collectiveWaitOnThisThread());
  return true;
}

void Accelerator::setTotalSteps(int64_t steps) {
  if (steps < 0) {
    throw InvalidArgument("Accelerator::setTotalSteps(" + std::to_string(steps) +
                          "): give the number of training steps, or 0 for unknown");
  }
  world_.heartbeat->setTotalSteps(steps);
}

void Accelerator::setProgressLoss(double loss) { world_.heartbeat->setLoss(loss); }

bool Accelerator::accumulate(const std::function<torch::Tensor()>& micro_step) {
  backward(micro_step());
  return step();
}

double Accelerator::clipGradNorm(double max_norm) {
  const CollectiveApi api("clipGradNorm");
  if (!strategy_) throw InvalidArgument("Accelerator::clipGradNorm before prepare");
  if (!(max_norm > 0) || !std::isfinite(max_norm)) {
    throw InvalidArgument("Accelerator::clipGradNorm: max_norm is " + std::to_string(max_norm) +
                          "; give a finite norm > 0");
  }
  return strategy_->clipGradNorm(max_norm);
}

void Accelerator::waitForEveryone() {
  const CollectiveApi api("waitForEveryone");
  world_.backend->barrier()->wait();
}

void Accelerator::mainProcessFirst(const std::function<void()>& work) {
  const CollectiveApi api("mainProcessFirst");
  if (!isMainProcess()) waitForEveryone();
  work();
  if (isMainProcess()) waitForEveryone();
}

torch::Tensor Accelerator::gather(const torch::Tensor& tensor) {
  const CollectiveApi api("gather");
  auto input = tensor.contiguous();
  std::vector<int64_t> shape = input.sizes().vec();
  if (shape.empty()) shape.push_back(1);
  shape[0] *= worldSize();
  auto output = torch::empty(shape, input.options());
  world_.backend
      ->allGather(input.data_ptr(), output.data_ptr(), static_cast<size_t>(input.numel()),
                  dtypeOf(input))
      ->wait();
  return output;
}

torch::Tensor Accelerator::gatherForMetrics(const torch::Tensor& tensor) {
  auto gathered = gather(tensor);
  const auto& at = *eval_position_;
  const bool last_batch = at.batches > 0 && at.batch == at.batches - 1;
  if (!last_batch || tensor.dim() == 0 || tensor.size(0) != static_cast<int64_t>(at.batch_size)) {
    return gathered;
  }
  return gathered.narrow(0, 0, static_cast<int64_t>(at.last_batch_examples));
}

torch::Tensor Accelerator::reduce(const torch::Tensor& tensor, const std::string& op) {
  if (op != "sum" && op != "mean") {
    throw InvalidArgument("reduce: unknown reduction '" + op + "'; give \"sum\" or \"mean\"");
  }
  const CollectiveApi api("reduce");
  auto out = tensor.contiguous().clone();
  allreduce(*world_.backend, out, ReduceOp::kSum)->wait();
  if (op == "mean") return torch::div(out, worldSize());
  return out;
}

torch::Tensor Accelerator::padAcrossProcesses(const torch::Tensor& tensor, int64_t dim,
                                              double pad_index, bool pad_first) {
  const int64_t dims = tensor.dim();
  if (dims == 0) return tensor;  // a scalar: nothing to pad, as accelerate
  if (dim < -dims || dim >= dims) {
    throw InvalidArgument("padAcrossProcesses: dim " + std::to_string(dim) + " of a tensor of " +
                          std::to_string(dims) + " dimensions");
  }
  if (dim < 0) dim += dims;
  const CollectiveApi api("padAcrossProcesses");
  // Every rank's (dimensions, size at dim): the dimensions must agree to pad at all.
  auto mine = torch::tensor({dims, tensor.size(dim)}, torch::kInt64);
  auto all = torch::empty({2 * worldSize()}, torch::kInt64);
  world_.backend->allGather(mine.data_ptr(), all.data_ptr(), 2, DType::kInt64)->wait();
  const auto* sizes = all.data_ptr<int64_t>();
  int64_t longest = 0;
  for (int r = 0; r < worldSize(); ++r) {
    if (sizes[2 * r] != dims) {
      throw InvalidArgument("padAcrossProcesses: rank " + std::to_string(r) + "'s tensor has " +
                            std::to_string(sizes[2 * r]) + " dimensions, rank " +
                            std::to_string(rank()) + "'s " + std::to_string(dims) +
                            "; give every rank tensors of the same dimensions");
    }
    longest = std::max(longest, sizes[2 * r + 1]);
  }
  if (longest == tensor.size(dim)) return tensor;
  auto shape = tensor.sizes().vec();
  shape[static_cast<size_t>(dim)] = longest;
  auto out = torch::full(shape, pad_index, tensor.options());
  const int64_t offset = pad_first ? longest - tensor.size(dim) : 0;
  out.narrow(dim, offset, tensor.size(dim)).copy_(tensor);
  return out;
}

std::pair<size_t, size_t> Accelerator::shareOf(size_t count) const {
  const auto world = static_cast<size_t>(worldSize()), r = static_cast<size_t>(rank());
  const size_t each = count / world, extra = count % world;
  const size_t begin = r * each + std::min(r, extra);
  return {begin, begin + each + (r < extra ? 1 : 0)};
}

torch::Tensor Accelerator::splitBetweenProcesses(const torch::Tensor& items) const {
  if (items.dim() == 0) throw InvalidArgument("splitBetweenProcesses: a scalar has no items");
  const auto [begin, end] = shareOf(static_cast<size_t>(items.size(0)));
  return items.narrow(0, static_cast<int64_t>(begin), static_cast<int64_t>(end - begin));
}

void Accelerator::initTrackers(const std::string& run_name, const RunConfig& config) {
  if (log_with_.empty() || !isMainProcess()) return;
  RunConfig resolved = config;
  const auto& e = world_.env;
  resolved.emplace_back("launch.world_size", e.world_size);
  resolved.emplace_back("launch.num_nodes", e.num_nodes);
  resolved.emplace_back("launch.strategy", e.strategy);
  resolved.emplace_back("launch.mixed_precision", e.mixed_precision);
  resolved.emplace_back("launch.gradient_accumulation_steps", accumulation_steps_);
  resolved.emplace_back("launch.gradient_clipping", clipping_);
  resolved.emplace_back("launch.backend", world_.backend->name());
  RunConfig summary = {{"world size", e.world_size},
                       {"nodes", e.num_nodes},
                       {"strategy", e.strategy},
                       {"mixed precision", e.mixed_precision},
                       {"backend", world_.backend->name()},
                       {"host of rank 0", hostName()}};
  if (!e.run_id.empty()) summary.emplace_back("run id", e.run_id);
  trackers_.reset();  // a second initTrackers starts another run: the last one's report ends
  trackers_ =
      std::make_unique<Trackers>(TrackerOptions{log_with_, project_dir_, run_name, report_every_},
                                 std::move(resolved), std::move(summary));
}

void Accelerator::log(const Scalars& values, std::optional<int64_t> step) {
  // A logged loss is also the launcher's progress line's, on every rank (main or not).
  for (const auto& [name, value] : values) {
    if (name == "loss") setProgressLoss(value);
  }
  if (log_with_.empty() || !isMainProcess()) return;
  if (!trackers_) {
    throw InvalidArgument(
        "log before initTrackers: call acc.initTrackers(run_name, config) once before logging");
  }
  trackers_->log(values, step.value_or(optimizer_steps_));
}

void Accelerator::endTraining() {
  if (trackers_) trackers_->finish();
}

namespace {
// The generators a checkpoint keeps: the CPU's, and the GPU's of a GPU worker (its dropout and
// random initialisations), as accelerate saves both.
std::vector<std::pair<std::string, at::Generator>> generatorsOf(const torch::Device& device) {
  std::vector<std::pair<std::string, at::Generator>> out = {
      {"rng_cpu", at::detail::getDefaultCPUGenerator()}};
  if (device.is_cuda()) out.emplace_back("rng_cuda", at::globalContext().defaultGenerator(device));
  return out;
}
}  // namespace

void Accelerator::saveState(const std::string& dir) {
  const CollectiveApi api("saveState");
  if (!strategy_) throw InvalidArgument("Accelerator::saveState before prepare");
  if (backward_pending_) {
    throw InvalidArgument(
        "Accelerator::saveState between backward and step: call acc.step() "
        "first, or the checkpoint would miss this step's gradients");
  }
  waitForCheckpoint();  // one save at a time: the snapshot is reused
  prune_when_committed_ = false;
  const auto began = checkpoint::AsyncSaver::Clock::now();
  std::vector<std::pair<std::string, std::string>> blobs;
  for (auto& [name, generator] : generatorsOf(device())) {
    torch::Tensor rng;
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      rng = generator.get_state();
    }
    blobs.emplace_back(name, std::string(static_cast<const char*>(rng.data_ptr()),
                                         static_cast<size_t>(rng.nbytes())));
  }
  if (isMainProcess()) {  // buffers are the same everywhere (broadcast at prepare)
    for (const auto& item : model_->named_buffers()) {
      const torch::Tensor b = item.value().to(torch::kCPU).contiguous();
      blobs.emplace_back("buffer:" + item.key(),
                         std::string(static_cast<const char*>(b.data_ptr()), b.nbytes()));
    }
  }
  checkpoint::Counters counters = {{"optimizer_steps", std::to_string(optimizer_steps_)},
                                   {"micro_step", std::to_string(micro_step_)},
                                   {"strategy", world_.env.strategy},
                                   {"mixed_precision", precision_.name}};
  if (scheduler_ != nullptr) counters["scheduler_steps"] = std::to_string(scheduler_->stepCount());
  // Each parameter group's learning rate, as an optimizer's state_dict keeps it: what a trainer
  // set by hand (without an LrScheduler) resumes too. 17 digits: the double round-trips exactly.
  const auto& groups = optimizer_->param_groups();
  counters["lr_groups"] = std::to_string(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    char lr[32];
    std::snprintf(lr, sizeof(lr), "%.17g", groups[g].options().get_lr());
    counters["lr:" + std::to_string(g)] = lr;
  }
  if (scaler_) counters["loss_scaler"] = scaler_->save();
  // A buffer's blob is its bytes; `cxxlaunch merge-weights` writes it as a tensor, from this.
  for (const auto& item : model_->named_buffers()) {
    std::string layout;
    try {
      layout = checkpoint::safetensorsDtypeName(item.value().scalar_type());
    } catch (const InvalidArgument&) {
      continue;  // a dtype safetensors lacks: merge-weights leaves it out, with a note
    }
    layout += ':';
    for (int64_t d : item.value().sizes()) layout += std::to_string(d) + ',';
    if (layout.back() == ',') layout.pop_back();
    counters["buffer:" + item.key()] = layout;
  }
  counters.merge(strategy_->stateCounters(optimizer_steps_));
  const bool full = world_.env.state_dict_type == "full";
  if (async_saver_) {
    const bool pinned = device().is_cuda();
    if (full) {
      async_saver_->startFull(*world_.backend, dir, strategy_->fullState(), std::move(blobs),
                              std::move(counters), pinned, began);
    } else {
      async_saver_->start(*world_.backend, dir, strategy_->stateSlices(), std::move(blobs),
                          std::move(counters), pinned, began);
    }
    return;
  }
  const uint64_t bytes =
      full ? checkpoint::saveFull(*world_.backend, dir, strategy_->fullState(), blobs, counters)
           : checkpoint::save(*world_.backend, dir, strategy_->stateSlices(), blobs, counters);
  const double seconds =
      std::chrono::duration<double>(checkpoint::AsyncSaver::Clock::now() - began).count();
  committed({dir, bytes, seconds, seconds});
}

void Accelerator::waitForCheckpoint() {
  const CollectiveApi api("waitForCheckpoint");
  if (!checkpointInFlight()) return;
  if (auto report = async_saver_->finish(*world_.backend)) committed(std::move(*report));
}

void Accelerator::reserveSnapshot() {
  // After the first optimizer step the optimizer state exists, and the snapshot's size is known.
  // Not under nvme offload, whose state views are reads of its swap files.
  if (world_.env.offload_optimizer == "nvme" || world_.env.offload_params == "nvme") return;
  int64_t numel = 0;
  try {
    if (world_.env.state_dict_type == "full") {
      if (isMainProcess()) {
        for (const auto& l : strategy_->fullState().layout) {
          numel += (l.end - l.begin) * static_cast<int64_t>(l.arrays.size());
        }
      }
    } else {
      for (const auto& slice : strategy_->stateSlices()) {
        for (const auto& [name, array] : slice.arrays) numel += array.numel();
      }
    }
  } catch (const Error&) {  // a state saveState refuses: it will say so
    return;
  }
  async_saver_->reserve(numel, device().is_cuda());
}

void Accelerator::committed(checkpoint::SaveReport report) {
  if (std::exchange(prune_when_committed_, false) && checkpoint_total_limit_ > 0 &&
      isMainProcess()) {
    checkpoint::removeOldest(checkpoint_dir_, static_cast<size_t>(checkpoint_total_limit_));
  }
  save_reports_.push_back(std::move(report));
}

std::string Accelerator::loadState(const std::string& path) {
  const CollectiveApi api("loadState");
  if (!strategy_) throw InvalidArgument("Accelerator::loadState before prepare");
  waitForCheckpoint();  // the save in flight may be the one to load
  // The lowest rank for which `failed`, or -1: every rank learns whether all of them succeeded.
  auto lowestFailing = [&](bool failed) {
    int32_t lowest = failed ? rank() : worldSize();
    world_.backend->allreduce(&lowest, 1, DType::kInt32, ReduceOp::kMin)->wait();
    return lowest == worldSize() ? -1 : lowest;
  };
  // Each checkpoint whose files have their sizes, newest first, until one loads on every rank.
  // Its files check each chunk as it is read (formats 2 and 3: one pass; format 1's files are
  // checked first, the ranks sharing them). Anything wrong on any rank (a checksum, a header, a
  // name or shape, a permission) sends every rank on to the next one, with a note; the one loaded
  // last overwrites whatever a failed one had read. Two agreements, so that a rank that cannot
  // even open the files never meets the others' collectives inside the restore.
  std::vector<std::string> skipped;
  for (const std::string& dir : checkpoint::complete(path, /*checksums=*/false)) {
    std::string problem;
    std::optional<checkpoint::Reader> reader;
    try {
      reader.emplace(dir);
      if (!reader->checksReads() && !checkpoint::verifyShare(dir, rank(), worldSize())) {
        problem = "a file does not match its checksum";
      }
    } catch (const Error& e) {
      problem = e.what();
    }
    int failed = lowestFailing(!problem.empty());
    if (failed < 0) {
      try {
        restoreFrom(*reader);
        if (auto corruption = reader->corruption()) problem = *corruption;
      } catch (const Error& e) {  // a peer's failure to read too: the agreement below tells
        problem = e.what();
      }
      failed = lowestFailing(!problem.empty());
      if (failed < 0) return dir;
    }
    if (failed == rank()) {  // one note, from the lowest rank that knows why
      // The file is to blame when it no longer matches its manifest; else it does not fit.
      const bool intact = checkpoint::verifyShare(dir, 0, 1);
      std::cerr << "cxxlaunch: checkpoint '" << dir << "' cannot be loaded on rank " << rank()
                << (intact ? " (its files are intact: was it saved from another model?): "
                           : " (it is corrupt): ")
                << problem << "; trying the previous one\n";
    }
    skipped.push_back(
        dir + (problem.empty() ? " (rank " + std::to_string(failed) + ")" : ": " + problem));
  }
  std::string why;
  for (const auto& s : skipped) why += "\n  " + s;
  throw InvalidArgument(
      skipped.empty()
          ? "no complete checkpoint at '" + path +
                "' (a checkpoint directory has a manifest; a folder of them is searched for the "
                "newest complete one)"
          : "no checkpoint at '" + path + "' can be loaded; each was tried, newest first:" + why +
                "\nMove the folder away (or remove these checkpoints) to start from step 0.");
}

void Accelerator::restoreFrom(const checkpoint::Reader& reader) {
  const std::string& dir = reader.directory();
  // The counters first: a bad one (a damaged or crafted manifest) stops the load before anything
  // changed.
  const int64_t optimizer_steps = reader.wholeCounter("optimizer_steps", 0);
  const int64_t micro_step = reader.wholeCounter("micro_step", 0);
  const int64_t scheduler_steps = reader.wholeCounter("scheduler_steps", 0);
  // The saved learning rates where the groups are the same in number (an LrScheduler then sets
  // its own, the same for the same step).
  auto& groups = optimizer_->param_groups();
  std::vector<std::optional<double>> lrs;
  if (reader.wholeCounter("lr_groups", -1) == static_cast<int64_t>(groups.size())) {
    for (size_t g = 0; g < groups.size(); ++g) {
      lrs.push_back(reader.realCounter("lr:" + std::to_string(g)));
    }
  }
  std::optional<LossScaler> scaler = scaler_;
  if (const auto state = reader.counter("loss_scaler"); state && scaler) scaler->restore(*state);

  strategy_->loadStateSlices(reader);
  torch::NoGradGuard no_grad;
  for (const auto& item : model_->named_buffers()) {
    torch::Tensor b = item.value();
    const auto bytes = reader.blob(0, "buffer:" + item.key());
    if (!bytes || bytes->size() != b.nbytes() || !b.is_contiguous()) {
      throw InvalidArgument("checkpoint '" + dir + "' has no buffer '" + item.key() +
                            "' of this model's size");
    }
    // from_blob wants a mutable pointer; copy_ only reads it.
    b.copy_(torch::from_blob(const_cast<char*>(bytes->data()), b.sizes(),
                             b.options().device(torch::kCPU)));
  }
  std::vector<std::pair<at::Generator, std::string>> rngs;
  for (auto& [name, generator] : generatorsOf(device())) {
    if (auto state = reader.blob(rank(), name)) rngs.emplace_back(generator, std::move(*state));
  }
  if (reader.corruption()) return;  // loadState loads another checkpoint over all of this
  // Each rank its own generators; a rank the saving job did not have (or a CPU job's checkpoint
  // in a GPU job) keeps its own.
  for (auto& [generator, bytes] : rngs) {
    torch::Tensor state = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
    std::memcpy(state.data_ptr(), bytes.data(), bytes.size());
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state);
  }
  optimizer_steps_ = optimizer_steps;
  micro_step_ = micro_step;
  resume_position_ = micro_step_;
  for (size_t g = 0; g < lrs.size(); ++g) {
    if (lrs[g]) groups[g].options().set_lr(*lrs[g]);
  }
  if (scheduler_ != nullptr) scheduler_->setStepCount(scheduler_steps);
  scaler_ = scaler;
  strategy_->zeroGrad();
}

void Accelerator::saveModel(const std::string& dir, uint64_t max_file_bytes,
                            std::optional<c10::ScalarType> wanted) {
  const CollectiveApi api("saveModel");
  if (!strategy_) throw InvalidArgument("Accelerator::saveModel before prepare");
  if (max_file_bytes == 0) {
    throw InvalidArgument(
        "Accelerator::saveModel: max_file_bytes is 0; give the largest file to "
        "write in bytes (e.g. 5'000'000'000)");
  }
  const c10::ScalarType dtype =
      wanted.value_or(!world_.env.zero3_save_16bit_model ? c10::ScalarType::Float
                      : precision_.mixed()               ? precision_.compute
                                                         : c10::ScalarType::BFloat16);
  // Every tensor's place is known before the gathers: each is written as it comes, one unit at a
  // time, in the model's order in the files.
  std::vector<checkpoint::SafetensorsWriter::Planned> plan;
  for (const auto& item : model_->named_parameters()) {
    plan.push_back({item.key(), item.value().sizes().vec(), dtype});
  }
  for (const auto& item : model_->named_buffers()) {
    plan.push_back({item.key(), item.value().sizes().vec(), item.value().scalar_type()});
  }
  std::optional<checkpoint::SafetensorsWriter> writer;
  std::string error;
  try {
    if (isMainProcess()) writer.emplace(dir, max_file_bytes, std::move(plan));
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Every rank takes part in the gathers; rank 0 writes, or remembers why it cannot.
  strategy_->visitFullParameters([&](const std::string& name, const torch::Tensor& value) {
    if (!writer || !error.empty()) return;
    try {
      writer->add(name, value.to(dtype));
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  if (writer && error.empty()) {
    try {
      for (const auto& item : model_->named_buffers()) writer->add(item.key(), item.value());
      writer->finish();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  int32_t ok = error.empty() ? 1 : 0;
  world_.backend->allreduce(&ok, 1, DType::kInt32, ReduceOp::kMin)->wait();
  if (ok == 0) {
    throw CommunicationError("saveModel '" + dir + "' failed" +
                             (error.empty() ? " on rank 0 (see its log)" : ": " + error));
  }
}

void Accelerator::loadModel(const std::string& dir) {
  const CollectiveApi api("loadModel");
  if (!strategy_) throw InvalidArgument("Accelerator::loadModel before prepare");
  const checkpoint::ModelSource source(dir);
  // Every rank reads the same files: all refuse alike, before any collective of the load.
  if (const std::string why = source.mismatch(*model_); !why.empty()) {
    throw InvalidArgument("'" + dir + "' does not hold this model's tensors:" + why);
  }
  strategy_->loadStateSlices(source);
  torch::NoGradGuard no_grad;
  for (const auto& item : model_->named_buffers()) {
    const torch::Tensor saved = source.tensor(item.key());
    if (!saved.defined() || saved.sizes() != item.value().sizes()) {
      throw InvalidArgument("'" + dir + "' has no buffer '" + item.key() +
                            "' of this model's shape");
    }
    item.value().copy_(saved);
  }
  optimizer_steps_ = 0;
  micro_step_ = 0;
}

void Accelerator::save(const std::string& path, const std::string& bytes) const {
  if (isMainProcess()) writeFileAtomically(path, bytes);
}

void Accelerator::save(const std::string& path,
                       const std::vector<std::pair<std::string, torch::Tensor>>& tensors) const {
  if (isMainProcess()) checkpoint::writeSafetensorsFile(path, tensors);
}

std::string Accelerator::saveCheckpoint() {
  const CollectiveApi api("saveCheckpoint");
  if (checkpoint_dir_.empty()) {
    throw InvalidArgument(
        "saveCheckpoint needs a checkpoint folder: launch with --checkpoint_dir DIR (or "
        "CXXLAUNCH_CHECKPOINT_DIR, or cxxlaunch.checkpoint_dir in the config)");
  }
  const std::string dir = checkpoint_dir_ + "/checkpoint_" + std::to_string(optimizer_steps_);
  saveState(dir);
  // Pruning counts complete checkpoints only: an asynchronous save prunes again once committed.
  prune_when_committed_ = checkpointInFlight();
  if (checkpoint_total_limit_ > 0 && isMainProcess()) {
    checkpoint::removeOldest(checkpoint_dir_, static_cast<size_t>(checkpoint_total_limit_));
  }
  waitForEveryone();
  return dir;
}

std::optional<std::string> Accelerator::resume() {
  const CollectiveApi api("resume");
  // A folder that holds checkpoints, none of which loads, is an error: starting from step 0 would
  // silently throw away the run (and the next save would remove the checkpoints in the end).
  waitForCheckpoint();
  if (checkpoint_dir_.empty() || !checkpoint::holdsCheckpoints(checkpoint_dir_)) {
    return std::nullopt;
  }
  return loadState(checkpoint_dir_);
}

void Accelerator::requireBatchSize(size_t batch_size) {
  if (batch_size == 0) {
    throw InvalidArgument(
        "prepareDataLoader: batch_size is 0; give the examples per process per micro-step (>= 1)");
  }
}

std::optional<int64_t> Accelerator::takeResumePosition() {
  return std::exchange(resume_position_, std::nullopt);
}

MemoryReport Accelerator::memoryReport() const {
  MemoryReport report = strategy_ ? strategy_->memoryReport() : MemoryReport{};
#if defined(CXXLAUNCH_TORCH_CUDA)
  if (device().is_cuda()) {  // [0]: the aggregate over LibTorch's small and large pools
    report.device_peak = static_cast<size_t>(
        c10::cuda::CUDACachingAllocator::getDeviceStats(device().index()).allocated_bytes[0].peak);
  }
#endif
  return report;
}

std::string Accelerator::describeStrategy() const {
  return strategy_ ? strategy_->describe() : world_.env.strategy + " (not prepared)";
}

std::vector<std::pair<std::string, torch::Tensor>> Accelerator::fullParameters() {
  const CollectiveApi api("fullParameters");
  if (!strategy_) throw InvalidArgument("Accelerator::fullParameters before prepare");
  return strategy_->fullParameters();
}

std::string Accelerator::describeBatch(size_t per_process_batch) const {
  return "global batch " +
         std::to_string(per_process_batch * static_cast<size_t>(worldSize()) *
                        static_cast<size_t>(accumulation_steps_)) +
         " = " + std::to_string(per_process_batch) + " per process x " +
         std::to_string(worldSize()) + " processes x " + std::to_string(accumulation_steps_) +
         " accumulation steps";
}

}  // namespace cxxlaunch::runtime
