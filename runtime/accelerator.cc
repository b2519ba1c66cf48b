#include "runtime/accelerator.h"

#if defined(CXXLAUNCH_TORCH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <torch/cuda.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <utility>

#include "common/error.h"
#include "common/host.h"
#include "common/host_memory.h"
#include "common/tracker_names.h"
#include "runtime/checkpoint/async_save.h"
#include "runtime/comm/checked_backend.h"
#include "runtime/comm/tensor_ops.h"
#include "runtime/error_report.h"
#include "runtime/strategy/strategy.h"

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
      checkpoint_prefix_(options.checkpoint_prefix),
      checkpoint_total_limit_(
          options.checkpoint_total_limit.value_or(world_.env.checkpoint_total_limit)) {
  if (checkpoint_total_limit_ < 0) {
    throw InvalidArgument(
        "AcceleratorOptions::checkpoint_total_limit is negative; give the "
        "number of checkpoints to keep, or 0 for all");
  }
  if (checkpoint_prefix_ != "checkpoint_" && checkpoint_prefix_ != "checkpoint-") {
    throw InvalidArgument("AcceleratorOptions::checkpoint_prefix '" + checkpoint_prefix_ +
                          "' is neither \"checkpoint_\" (accelerate's) nor \"checkpoint-\" "
                          "(Trainer's): resume and pruning find only those");
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
  resolved.emplace_back("launch.strategy", std::string(e.strategy.name()));
  resolved.emplace_back("launch.mixed_precision", e.mixed_precision);
  resolved.emplace_back("launch.gradient_accumulation_steps", accumulation_steps_);
  resolved.emplace_back("launch.gradient_clipping", clipping_);
  resolved.emplace_back("launch.backend", world_.backend->name());
  RunConfig summary = {{"world size", e.world_size},
                       {"nodes", e.num_nodes},
                       {"strategy", std::string(e.strategy.name())},
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
  return strategy_ ? strategy_->describe()
                   : std::string(world_.env.strategy.name()) + " (not prepared)";
}

std::vector<std::pair<std::string, torch::Tensor>> Accelerator::fullParameters(
    const std::function<bool(const std::string&)>& keep) {
  const CollectiveApi api("fullParameters");
  if (!strategy_) throw InvalidArgument("Accelerator::fullParameters before prepare");
  return strategy_->fullParameters(keep);
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
