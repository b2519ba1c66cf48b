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
#include "runtime/accelerator_impl.h"
#include "runtime/checkpoint/async_save.h"
#include "runtime/comm/checked_backend.h"
#include "runtime/comm/tensor_ops.h"
#include "runtime/deferred_init.h"
#include "runtime/error_report.h"
#include "runtime/strategy/strategy.h"
#include "runtime/strategy/unit_registry.h"

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
    : impl_(std::make_unique<Impl>()) {
  impl_->world = std::move(world);
  impl_->bucket_bytes = options.bucket_bytes;
  impl_->find_unused = options.find_unused_parameters;
  impl_->checkpoint_dir = options.checkpoint_dir.value_or(impl_->world.env.checkpoint_dir);
  impl_->checkpoint_prefix = options.checkpoint_prefix;
  impl_->checkpoint_total_limit =
      options.checkpoint_total_limit.value_or(impl_->world.env.checkpoint_total_limit);
  if (impl_->checkpoint_total_limit < 0) {
    throw InvalidArgument(
        "AcceleratorOptions::checkpoint_total_limit is negative; give the "
        "number of checkpoints to keep, or 0 for all");
  }
  if (impl_->checkpoint_prefix != "checkpoint_" && impl_->checkpoint_prefix != "checkpoint-") {
    throw InvalidArgument("AcceleratorOptions::checkpoint_prefix '" + impl_->checkpoint_prefix +
                          "' is neither \"checkpoint_\" (accelerate's) nor \"checkpoint-\" "
                          "(Trainer's): resume and pruning find only those");
  }
  impl_->log_with = options.log_with
                        ? parseTrackerList(*options.log_with, "AcceleratorOptions::log_with")
                        : impl_->world.env.log_with;
  impl_->project_dir = options.project_dir.value_or(impl_->world.env.project_dir);
  impl_->report_every = options.report_every;
  if (options.checkpoint_async.value_or(impl_->world.env.checkpoint_async)) {
    impl_->async_saver = std::make_unique<checkpoint::AsyncSaver>();
  }
  installUncaughtErrorReport(impl_->world.env.error_file);
  if (impl_->world.env.gradient_accumulation_steps < 1) {
    throw InvalidArgument("gradient accumulation steps must be >= 1");
  }
  keepFreedHostMemory();
  impl_->accumulation_steps = impl_->world.env.gradient_accumulation_steps;
  impl_->clipping = impl_->world.env.gradient_clipping;
  if (!impl_->world.heartbeat) {
    impl_->world.heartbeat = std::make_shared<Heartbeat>(impl_->world.env.heartbeat_file);
  }
  if (!impl_->world.backend) {
    if (!impl_->world.store) impl_->world.store = storeFromEnv(impl_->world.env);
    // As accelerate: a worker that sees a GPU trains on it (over NCCL, with backend auto); the
    // launcher's --cpu hides them (CUDA_VISIBLE_DEVICES empty).
    impl_->world.backend = backendFromEnv(impl_->world.env, impl_->world.store,
                                          torch::cuda::is_available(), impl_->world.heartbeat);
  }
  impl_->precision = precisionPolicy(impl_->world.env.mixed_precision, device().type());
  if (impl_->precision.scalesLoss() || options.loss_scaling) {
    impl_->scaler.emplace(options.loss_scaling.value_or(LossScalerOptions{}));
  }
}

Accelerator::~Accelerator() {
  for (const auto* module : impl_->checkpointed) detail::setCheckpointActivations(module, false);
  if (checkpointInFlight()) {
    if (std::uncaught_exceptions() > 0) {
      impl_->async_saver
          ->abandon();  // the other ranks may never come: left incomplete, uncommitted
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
  if (impl_->backward_pending && std::uncaught_exceptions() == 0) {
    std::cerr << "cxxlaunch: warning: the last Accelerator::backward had no Accelerator::step "
                 "after it, so its gradients were never applied (call acc.step() after each "
                 "acc.backward)\n";
  }
}

int Accelerator::rank() const { return impl_->world.env.rank; }
int Accelerator::localRank() const { return impl_->world.env.local_rank; }
int Accelerator::worldSize() const { return impl_->world.env.world_size; }
int Accelerator::gradientAccumulationSteps() const { return impl_->accumulation_steps; }
const WorkerEnv& Accelerator::env() const { return impl_->world.env; }
Backend& Accelerator::backend() { return *impl_->world.backend; }
DeferredInit Accelerator::deferredInit() const {
  const WorkerEnv& env = impl_->world.env;
  return DeferredInit(env.zero3_init_flag || env.fsdp_cpu_ram_efficient_loading);
}
bool Accelerator::stepWasSkipped() const { return impl_->step_was_skipped; }
double Accelerator::lossScale() const { return impl_->scaler ? impl_->scaler->scale() : 1.0; }
const PrecisionPolicy& Accelerator::precision() const { return impl_->precision; }
const std::vector<std::string>& Accelerator::trackerNames() const { return impl_->log_with; }
std::string Accelerator::reportPath() const {
  return impl_->trackers ? impl_->trackers->reportPath() : "";
}
std::vector<checkpoint::SaveReport> Accelerator::takeSaveReports() {
  return std::exchange(impl_->save_reports, {});
}
const std::string& Accelerator::checkpointDir() const { return impl_->checkpoint_dir; }
int64_t Accelerator::optimizerSteps() const { return impl_->optimizer_steps; }
int64_t Accelerator::microSteps() const { return impl_->micro_step; }
std::shared_ptr<EvalPosition> Accelerator::evalPosition() const { return impl_->eval_position; }

torch::Device Accelerator::device() const {
  if (impl_->world.backend->name() == "nccl") {
    return {torch::kCUDA,
            static_cast<c10::DeviceIndex>(impl_->world.env.device.value_or(localRank()))};
  }
  return torch::kCPU;
}

void Accelerator::wrap(const torch::nn::Module& unit) {
  if (impl_->strategy)
    throw InvalidArgument("Accelerator::wrap after prepare: mark units before it");
  impl_->wrapped.push_back(&unit);
}

void Accelerator::checkpointActivations(const torch::nn::Module& block, bool on) {
  detail::setCheckpointActivations(&block, on);
  if (on) impl_->checkpointed.push_back(&block);
}

void Accelerator::prepare(std::shared_ptr<torch::nn::Module> model,
                          torch::optim::Optimizer& optimizer, LrScheduler* scheduler) {
  const CollectiveApi api("prepare");
  // As accelerate's prepare: the model trains on this worker's device (a GPU under NCCL).
  moveModule(*model, device());
  StrategyOptions options;
  options.bucket_bytes = impl_->bucket_bytes;
  options.find_unused_parameters = impl_->find_unused;
  options.wrapped = impl_->wrapped;
  options.precision = impl_->precision;
  impl_->strategy = makeStrategy(impl_->world.env, impl_->world.backend, model, optimizer, options);
  impl_->scheduler = scheduler;
  // The schedule's length is the run's, unless the trainer said otherwise (setTotalSteps).
  if (impl_->scheduler != nullptr && impl_->world.heartbeat->record().total == 0) {
    impl_->world.heartbeat->setTotalSteps(impl_->scheduler->totalSteps());
  }
  impl_->optimizer = &optimizer;
  impl_->model = model;
  if (impl_->world.env.fsdp_activation_checkpointing) checkpointUnits();
  if (impl_->precision.mixed()) {
    impl_->autocast =
        std::make_unique<AutocastScope>(device().type(), impl_->precision.compute, true);
  }
}

// The wrap policy's modules, as the strategy's plan found them (unit_plan.h), whether or not
// they are sharded at rest.
void Accelerator::checkpointUnits() {
  const std::vector<const torch::nn::Module*> blocks = impl_->strategy->unitModules();
  if (blocks.empty()) {
    throw InvalidArgument(
        "fsdp_activation_checkpointing is on, but no module is a unit to checkpoint: name the "
        "block type with fsdp_transformer_layer_cls_to_wrap, or mark blocks with "
        "Accelerator::wrap or Accelerator::checkpointActivations");
  }
  for (const auto* block : blocks) checkpointActivations(*block);
}

bool Accelerator::syncGradients() const {
  return (impl_->micro_step + 1) % impl_->accumulation_steps == 0;
}

void Accelerator::backward(const torch::Tensor& loss) {
  const CollectiveApi api("backward");
  if (!impl_->strategy)
    throw InvalidArgument("Accelerator::backward before prepare(model, optimizer)");
  // The trainer that steps its own optimizer instead of acc.step() must hear it at once: under
  // ZeRO-2/3 and FSDP the optimizer's step() finds no gradients (they live in the strategy's
  // shards) and changes nothing, and under every strategy the schedule would not advance.
  if (impl_->backward_pending) {
    throw InvalidArgument(
        "Accelerator::backward was called again without Accelerator::step after the last one: "
        "call acc.step() after each acc.backward(loss), not optimizer.step() (acc.step() steps "
        "the optimizer, which under ZeRO and FSDP runs on the strategy's shards, and the LR "
        "schedule, and counts gradient accumulation). For several losses in one step, call "
        "acc.backward on their sum");
  }
  impl_->backward_pending = true;
  impl_->world.heartbeat->beat();  // progress, for the launcher's --watchdog_timeout
  const bool sync = syncGradients();
  impl_->strategy->beforeBackward(sync);
  torch::Tensor scaled = impl_->accumulation_steps > 1 ? loss / impl_->accumulation_steps : loss;
  if (impl_->scaler) scaled = scaled * impl_->scaler->scale();
  {
    // Backward runs the dtypes its forward chose; autocast is for forward passes only.
    std::optional<AutocastScope> no_autocast;
    if (impl_->autocast) no_autocast.emplace(device().type(), impl_->precision.compute, false);
    scaled.backward();
  }
  impl_->strategy->afterBackward(sync);
}

bool Accelerator::step() {
  const CollectiveApi api("step");
  if (!impl_->strategy) throw InvalidArgument("Accelerator::step before prepare(model, optimizer)");
  impl_->backward_pending = false;
  if (checkpointInFlight()) {
    if (auto report = impl_->async_saver->poll(*impl_->world.backend))
      committed(std::move(*report));
  }
  const bool sync = syncGradients();
  ++impl_->micro_step;
  if (!sync) return false;
  if (impl_->scaler) {
    const bool finite = impl_->strategy->unscaleGradients(1.0 / impl_->scaler->scale());
    impl_->scaler->update(!finite);
    impl_->step_was_skipped = !finite;
    if (!finite) {
      impl_->strategy->zeroGrad();
      impl_->world.heartbeat->stepDone(impl_->micro_step / impl_->accumulation_steps,
                                       collectiveWaitOnThisThread());
      return true;
    }
  }
  if (impl_->clipping > 0) clipGradNorm(impl_->clipping);
  impl_->strategy->step();
  if (impl_->scheduler != nullptr) impl_->scheduler->step();
  impl_->strategy->zeroGrad();
  ++impl_->optimizer_steps;
  if (impl_->async_saver && !std::exchange(impl_->snapshot_reserved, true)) reserveSnapshot();
  // For the launcher's progress line and straggler check (heartbeat.h).
  impl_->world.heartbeat->stepDone(impl_->micro_step / impl_->accumulation_steps,
                                   collectiveWaitOnThisThread());
  return true;
}

void Accelerator::setTotalSteps(int64_t steps) {
  if (steps < 0) {
    throw InvalidArgument("Accelerator::setTotalSteps(" + std::to_string(steps) +
                          "): give the number of training steps, or 0 for unknown");
  }
  impl_->world.heartbeat->setTotalSteps(steps);
}

void Accelerator::setProgressLoss(double loss) { impl_->world.heartbeat->setLoss(loss); }

bool Accelerator::accumulate(const std::function<torch::Tensor()>& micro_step) {
  backward(micro_step());
  return step();
}

double Accelerator::clipGradNorm(double max_norm) {
  const CollectiveApi api("clipGradNorm");
  if (!impl_->strategy) throw InvalidArgument("Accelerator::clipGradNorm before prepare");
  if (!(max_norm > 0) || !std::isfinite(max_norm)) {
    throw InvalidArgument("Accelerator::clipGradNorm: max_norm is " + std::to_string(max_norm) +
                          "; give a finite norm > 0");
  }
  return impl_->strategy->clipGradNorm(max_norm);
}

void Accelerator::waitForEveryone() {
  const CollectiveApi api("waitForEveryone");
  impl_->world.backend->barrier()->wait();
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
  impl_->world.backend
      ->allGather(input.data_ptr(), output.data_ptr(), static_cast<size_t>(input.numel()),
                  dtypeOf(input))
      ->wait();
  return output;
}

torch::Tensor Accelerator::gatherForMetrics(const torch::Tensor& tensor) {
  auto gathered = gather(tensor);
  const auto& at = *impl_->eval_position;
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
  allreduce(*impl_->world.backend, out, ReduceOp::kSum)->wait();
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
  impl_->world.backend->allGather(mine.data_ptr(), all.data_ptr(), 2, DType::kInt64)->wait();
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
  if (impl_->log_with.empty() || !isMainProcess()) return;
  RunConfig resolved = config;
  const auto& e = impl_->world.env;
  resolved.emplace_back("launch.world_size", e.world_size);
  resolved.emplace_back("launch.num_nodes", e.num_nodes);
  resolved.emplace_back("launch.strategy", std::string(e.strategy.name()));
  resolved.emplace_back("launch.mixed_precision", e.mixed_precision);
  resolved.emplace_back("launch.gradient_accumulation_steps", impl_->accumulation_steps);
  resolved.emplace_back("launch.gradient_clipping", impl_->clipping);
  resolved.emplace_back("launch.backend", impl_->world.backend->name());
  RunConfig summary = {{"world size", e.world_size},
                       {"nodes", e.num_nodes},
                       {"strategy", std::string(e.strategy.name())},
                       {"mixed precision", e.mixed_precision},
                       {"backend", impl_->world.backend->name()},
                       {"host of rank 0", hostName()}};
  if (!e.run_id.empty()) summary.emplace_back("run id", e.run_id);
  impl_->trackers.reset();  // a second initTrackers starts another run: the last one's report ends
  impl_->trackers = std::make_unique<Trackers>(
      TrackerOptions{impl_->log_with, impl_->project_dir, run_name, impl_->report_every},
      std::move(resolved), std::move(summary));
}

void Accelerator::log(const Scalars& values, std::optional<int64_t> step) {
  // A logged loss is also the launcher's progress line's, on every rank (main or not).
  for (const auto& [name, value] : values) {
    if (name == "loss") setProgressLoss(value);
  }
  if (impl_->log_with.empty() || !isMainProcess()) return;
  if (!impl_->trackers) {
    throw InvalidArgument(
        "log before initTrackers: call acc.initTrackers(run_name, config) once before logging");
  }
  impl_->trackers->log(values, step.value_or(impl_->optimizer_steps));
}

void Accelerator::endTraining() {
  if (impl_->trackers) impl_->trackers->finish();
}

void Accelerator::requireBatchSize(size_t batch_size) {
  if (batch_size == 0) {
    throw InvalidArgument(
        "prepareDataLoader: batch_size is 0; give the examples per process per micro-step (>= 1)");
  }
}

std::optional<int64_t> Accelerator::takeResumePosition() {
  return std::exchange(impl_->resume_position, std::nullopt);
}

MemoryReport Accelerator::memoryReport() const {
  MemoryReport report = impl_->strategy ? impl_->strategy->memoryReport() : MemoryReport{};
#if defined(CXXLAUNCH_TORCH_CUDA)
  if (device().is_cuda()) {  // [0]: the aggregate over LibTorch's small and large pools
    report.device_peak = static_cast<size_t>(
        c10::cuda::CUDACachingAllocator::getDeviceStats(device().index()).allocated_bytes[0].peak);
  }
#endif
  return report;
}

std::string Accelerator::describeStrategy() const {
  return impl_->strategy ? impl_->strategy->describe()
                         : std::string(impl_->world.env.strategy.name()) + " (not prepared)";
}

std::vector<std::pair<std::string, torch::Tensor>> Accelerator::fullParameters(
    const std::function<bool(const std::string&)>& keep) {
  const CollectiveApi api("fullParameters");
  if (!impl_->strategy) throw InvalidArgument("Accelerator::fullParameters before prepare");
  return impl_->strategy->fullParameters(keep);
}

std::string Accelerator::describeBatch(size_t per_process_batch) const {
  return "global batch " +
         std::to_string(per_process_batch * static_cast<size_t>(worldSize()) *
                        static_cast<size_t>(impl_->accumulation_steps)) +
         " = " + std::to_string(per_process_batch) + " per process x " +
         std::to_string(worldSize()) + " processes x " + std::to_string(impl_->accumulation_steps) +
         " accumulation steps";
}

}  // namespace cxxlaunch::runtime
