#include "runtime/strategy/sharded.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>

#include "common/error.h"
#include "common/host_memory.h"
#include "runtime/comm/tensor_ops.h"
#include "runtime/deferred_init.h"
#include "runtime/error_report.h"
#include "runtime/optim/device_kernels.h"
#include "runtime/strategy/frozen_parameters.h"
#include "runtime/strategy/model_state.h"
#include "runtime/strategy/unit_plan.h"

namespace cxxlaunch::runtime {
namespace {

constexpr size_t kMaxReductionsInFlight = 2;

}  // namespace

ShardedStrategy::ShardedStrategy(std::shared_ptr<Backend> backend,
                                 std::shared_ptr<torch::nn::Module> model,
                                 torch::optim::Optimizer& optimizer, ShardingOptions options)
    : backend_(std::move(backend)),
      model_(std::move(model)),
      options_(std::move(options)),
      device_(model_->parameters().empty() ? c10::Device(c10::kCPU)
                                           : model_->parameters().front().device()),
      policy_(ShardingPolicy::of(options_, device_)) {
  if (options_.trainer_optimizer) {
    replicated_ = std::make_unique<ReplicatedParameters>(model_, optimizer, backend_->rank(),
                                                         backend_->worldSize());
  } else {
    optimizer_ = std::make_unique<ShardOptimizer>(optimizer);
  }
  // Where memory is the point, freed memory goes back to the kernel (host_memory.h).
  if (policy_.return_freed_memory) returnFreedHostMemory();
  if (policy_.pool_buffers) pool_ = std::make_unique<BufferPool>();  // sized by sizePool()
  // A model built under a DeferredInit: a unit's parameters are made as the unit is built (when
  // parameters rest sharded, so that no rank holds the model whole); everything else now, frozen
  // in 16 bits.
  materializeParameters(*model_, !policy_.reshard_after_forward, options_.compute_dtype);
  if (options_.sync_module_states) broadcastModuleState(*backend_, *model_, 0);
  shards_ = backend_;
  if (options_.hybrid) connectHybridGroups();
  ctx_ = {.every = backend_.get(),
          .shards = shards_.get(),
          .replicas = replicas_.get(),
          .pool = pool_.get(),
          .policy = policy_,
          .compute_dtype = options_.compute_dtype};
  buildUnits();
  // Sized once the units are built: the build's buffers (each unit's, freed as it comes to rest)
  // go back to the kernel, so that a model made unit by unit is never held whole; the first step
  // fills the pool.
  if (pool_) sizePool();
  if (!replicated_) releaseFreedHostMemory();  // the old storage of parameters now flat
}

void ShardedStrategy::sizePool() {
  // What a step holds at once of the units of one size (their flat buffers in the compute
  // dtype): two gathered (the unit in use and the one prefetched, forward or backward), three
  // full gradients (the one being filled and kMaxReductionsInFlight being reduced) and three
  // reductions' outputs of the shard's size (a launch makes its output before the oldest
  // completes). Only module units are gathered; a unit of one parameter takes autograd's
  // gradient as its own (ShardUnit::takeGradient), none from the pool. Units of one size share
  // their classes, so the pool keeps at most what one step has in use at its peak.
  struct Units {
    size_t gathered = 0, gradients = 0, reduced = 0, shard_bytes = 0;
  };
  std::map<size_t, Units> by_size;  // by the flat buffer's bytes
  const size_t element = c10::elementSize(options_.compute_dtype);
  for (const ShardUnit& u : units_) {
    Units& n = by_size[static_cast<size_t>(u.flat().padded()) * element];
    n.gathered += u.module() != nullptr;
    n.gradients += u.flat().params().size() > 1 || u.flat().numel() != u.flat().padded();
    n.reduced += 1;
    n.shard_bytes = static_cast<size_t>(u.flat().shardNumel()) * element;
  }
  for (const auto& [bytes, n] : by_size) {
    pool_->addClass(
        bytes, std::min<size_t>(n.gathered, 2) + std::min(n.gradients, kMaxReductionsInFlight + 1));
    pool_->addClass(n.shard_bytes, std::min(n.reduced, kMaxReductionsInFlight + 1));
  }
}

ShardedStrategy::~ShardedStrategy() {
  readiness_.reset();  // no hook runs from here on
  for (auto& u : units_) {
    if (u.module() != nullptr) detail::unregisterUnit(u.module());
    u.drain();
  }
}

void ShardedStrategy::connectHybridGroups() {
  const int world = backend_->worldSize();
  std::vector<int32_t> node_of(static_cast<size_t>(world));
  int32_t mine = options_.node;
  backend_->allGather(&mine, node_of.data(), 1, DType::kInt32)->wait();
  std::map<int32_t, std::vector<int>> members;  // node -> its ranks, ascending
  for (int r = 0; r < world; ++r) members[node_of[static_cast<size_t>(r)]].push_back(r);
  const std::vector<int>& node = members.at(mine);
  for (const auto& [id, ranks] : members) {
    if (ranks.size() != node.size()) {
      throw InvalidArgument("HYBRID_SHARD needs the same number of processes on every node (node " +
                            std::to_string(mine) + " has " + std::to_string(node.size()) +
                            ", node " + std::to_string(id) + " has " +
                            std::to_string(ranks.size()) + "); use FULL_SHARD");
    }
  }
  const size_t index = static_cast<size_t>(rankInGroup(node, backend_->rank()));
  std::vector<int> replica;  // the index-th rank of every node
  for (const auto& [id, ranks] : members) replica.push_back(ranks[index]);
  std::sort(replica.begin(), replica.end());
  shards_ = backend_->subgroup(node, "node");
  if (replica.size() > 1) replicas_ = backend_->subgroup(replica, "replica");
}

void ShardedStrategy::buildUnits() {
  const int world = shards_->worldSize(), rank = shards_->rank();
  UnitPlan plan = planUnits(*model_, {.policy = options_.wrap_policy,
                                      .unit_types = options_.unit_types,
                                      .min_num_params = options_.min_num_params,
                                      .wrapped = options_.wrapped,
                                      .module_units = policy_.reshard_after_forward,
                                      .bucket_bytes = options_.bucket_bytes});
  frozen_ = std::move(plan.frozen);
  policy_modules_ = std::move(plan.policy_modules);
  for (const auto& planned : plan.units) units_.emplace_back(planned.name, planned.module);

  // Per unit: the flat buffer, the master shard, gradient buffers, the optimizer's shard. Then
  // the unit settles to its state at rest, before the next one adds memory: a model built under
  // a DeferredInit is never whole on any rank.
  // An optimizer not sharded: one "shard" of everything on every rank.
  const int flat_world = policy_.shard_optimizer ? world : 1,
            flat_rank = policy_.shard_optimizer ? rank : 0;
  std::vector<int64_t> shard_numels;
  for (const auto& planned : plan.units) {
    int64_t numel = 0;
    for (const auto& p : planned.params) numel += p.numel();
    shard_numels.push_back(FlatParameter::shardNumelOf(numel, flat_world));
  }
  const auto on = torch::TensorOptions().dtype(torch::kFloat);
  if (replicated_) {  // no fp32 shards: the parameters are the model's own tensors
  } else if (policy_.master == Placement::kNvme || policy_.optimizer_state == Placement::kNvme) {
    store_ = std::make_unique<NvmeStore>(
        *optimizer_, on.device(device_), policy_.gradient_shards == Placement::kNvme,
        options_.nvme_optimizer_dir, options_.nvme_param_dir, units_, shard_numels);
  } else {
    // cpu offload: pinned, so that the copies to and from the GPU run at the bus's speed,
    // without a bounce buffer.
    store_ = std::make_unique<MemoryStore>(
        *optimizer_,
        policy_.master == Placement::kHost ? on.device(torch::kCPU).pinned_memory(device_.is_cuda())
                                           : on.device(device_),
        options_.free_gradients_between_steps);
  }
  ctx_.store = store_.get();
  if (policy_.share_full_gradients && world > 1 &&
      !shard_numels.empty()) {  // buffers: the unit being filled, those reduced, one more
    const int64_t largest = *std::max_element(shard_numels.begin(), shard_numels.end()) * world;
    const size_t bytes = static_cast<size_t>(largest) * c10::elementSize(options_.compute_dtype);
    shared_grads_ = std::make_unique<SharedGradients>(*backend_, kMaxReductionsInFlight + 2, bytes);
  }
  // Replicated gradients: every unit's whole, all-reduced in place. Where the backend has memory
  // the ranks share (Gloo on one host) they all live there, one block: the all-reduce reads the
  // peers' buffers where they are and writes the average into each, no copy in or out. The same
  // decision on every rank (same units), so that all of them ask.
  std::vector<size_t> grad_offsets;
  std::shared_ptr<void> grad_block;
  if (!policy_.shard_gradients) {
    size_t total = 0;
    bool on_cpu = true;
    for (size_t ui = 0; ui < units_.size(); ++ui) {
      // DDP reduces in the parameters' own dtype, the flat engine in the compute dtype.
      const size_t elem = replicated_ ? plan.units[ui].params.front().element_size()
                                      : c10::elementSize(options_.compute_dtype);
      on_cpu = on_cpu && !plan.units[ui].params.front().device().is_cuda();
      grad_offsets.push_back(total);
      total += (static_cast<size_t>(shard_numels[ui] * flat_world) * elem + 63) / 64 * 64;
    }
    if (on_cpu && world > 1 && total > 0) grad_block = backend_->sharedBuffer(total);
    gradients_shared_ = grad_block != nullptr;
  }
  // The replicated gradient buffer of unit `ui`, in `options`' dtype.
  auto gradientBuffer = [&](size_t ui, int64_t numel, const torch::TensorOptions& options) {
    return grad_block ? torch::from_blob(
                            static_cast<char*>(grad_block.get()) + grad_offsets[ui], {numel},
                            [grad_block](void*) {}, options)
                      : torch::zeros({numel}, options);
  };
  for (size_t ui = 0; ui < units_.size(); ++ui) {
    ShardUnit& u = units_[ui];
    PlannedUnit& planned = plan.units[ui];
    if (replicated_) {  // the parameters stay where they are; the gradients are flat
      first_param_.push_back(used_.size());
      used_.resize(used_.size() + planned.params.size(), options_.find_unused_parameters ? 0 : 1);
      const auto options = planned.params.front().options();
      u.flat() = FlatParameter::layoutOf(std::move(planned.params), std::move(planned.names));
      u.placeGradientsIn(gradientBuffer(ui, u.flat().padded(), options));
      continue;
    }
    const bool deferred = std::any_of(planned.params.begin(), planned.params.end(), isDeferred);
    u.flat() =
        FlatParameter(std::move(planned.params), std::move(planned.names), flat_world, flat_rank);
    // Made just now, by each rank: rank 0's values, as broadcastModuleState gives the rest.
    if (deferred && options_.sync_module_states) broadcast(*backend_, u.flat().full(), 0)->wait();
    // The parameters' old storage, freed into the heap: returned unit by unit, so that the
    // model is never held twice.
    if (policy_.return_freed_memory) releaseFreedHostMemory();
    if (u.flat().params().front().scalar_type() != torch::kFloat) {
      throw InvalidArgument("sharded strategies train float32 parameters ('" +
                            u.flat().names().front() + "' is " +
                            std::string(c10::toString(u.flat().params().front().scalar_type())) +
                            "); mixed precision comes from the config's mixed_precision");
    }
    const int64_t sb = u.flat().shardBegin(), sn = u.flat().shardNumel();
    u.setMaster(policy_.own_master ? torch::empty({sn}, store_->options()).copy_(u.flat().shard())
                                   : u.flat().shard());
    // Before the gradient accumulators exist: they take the parameters' dtype.
    u.flat().convert(options_.compute_dtype);
    if (!policy_.shard_gradients) {
      const auto options = u.flat().full().options();
      u.placeGradientsIn(gradientBuffer(ui, u.flat().padded(), options));
      u.setGradientShard(policy_.own_gradient_shard ? torch::zeros({sn}, store_->options())
                                                    : u.fullGradient().narrow(0, sb, sn));
    }  // sharded: the gradient shard comes with the first reduction (ShardStore::addGradient)
    std::vector<ShardOptimizer::Segment> segments;
    for (size_t i = 0; i < u.flat().params().size(); ++i) {
      const int64_t begin = std::max(u.flat().offset(i), sb);
      const int64_t end = std::min(u.flat().offset(i) + u.flat().params()[i].numel(), sb + sn);
      const size_t group = optimizer_->groupOf(u.flat().params()[i]);
      if (begin >= end) continue;
      if (!segments.empty() && segments.back().group == group &&
          segments.back().end == begin - sb) {
        segments.back().end = end - sb;
      } else {
        segments.push_back({begin - sb, end - sb, group});
      }
    }
    u.setOptimizerShard(optimizer_->addShard(sn, std::move(segments), store_->options().device(),
                                             store_->optimizerKeepsState()));
    if (u.module() != nullptr) {
      unit_of_module_[u.module()] = ui;
      detail::registerUnit(u.module(), this);
    }
    settle(ui);
  }
  std::vector<std::vector<torch::Tensor>> groups;
  for (const auto& u : units_) groups.push_back(u.flat().params());
  readiness_ = std::make_unique<GradientReadiness>(
      groups, std::move(plan.reduce_order), [this](size_t u, size_t p) { onGradientReady(u, p); });
}

void ShardedStrategy::settle(size_t i) {
  ShardUnit& u = units_[i];
  store_->settle(u);
  // A unit the trainer marked with Accelerator::wrap, or of a type that says so, promises to run
  // through unitForward: it rests sharded from now on. One the policy chose rests so after its
  // first unitForward (a trainer that never calls it keeps it whole, and trains correctly).
  if (u.module() != nullptr && (std::find(options_.wrapped.begin(), options_.wrapped.end(),
                                          u.module()) != options_.wrapped.end() ||
                                detail::runsThroughUnitForward(u.module()))) {
    u.route();
    release(i);
  }
  // The optimizer's state, now that the unit holds what it keeps at rest: here for a unit that
  // is never released, in rested() for the others (one the policy chose: at its first
  // unitForward).
  if (!policy_.reshard_after_forward || u.module() == nullptr) {
    optimizer_->allocateState(u.optimizerShard());
  }
  if (policy_.return_freed_memory) releaseFreedHostMemory();
}

std::string ShardedStrategy::describe() const {
  if (replicated_) {
    return options_.name + ": " + std::to_string(units_.size()) + " gradient bucket(s)" +
           (gradients_shared_ ? " in shared memory" : "");
  }
  size_t modules = 0;
  for (const auto& u : units_) modules += u.module() != nullptr;
  return options_.name + ": " + std::to_string(units_.size()) + " unit(s) (" +
         std::to_string(modules) + " module(s), " + std::to_string(units_.size() - modules) +
         " bucket(s)), " + optimizer_->name() +
         (policy_.shard_optimizer ? " on 1/" + std::to_string(shards_->worldSize()) + " shards"
                                  : " on fp32 master weights") +
         (replicas_ ? " x " + std::to_string(replicas_->worldSize()) + " node replicas" : "") +
         (mixed() ? ", compute in " + std::string(c10::toString(options_.compute_dtype)) : "") +
         (shared_grads_ && !shared_grads_->empty() ? ", full gradients in shared memory" : "") +
         (policy_.optimizer_state == Placement::kHost ? ", optimizer on the CPU" : "") +
         (policy_.reshard_after_forward && options_.offload_params_to_host
              ? ", parameters offloaded"
              : "");
}

std::vector<const torch::nn::Module*> ShardedStrategy::unitModules() const {
  return policy_modules_;
}

std::vector<std::pair<std::string, int64_t>> ShardedStrategy::units() const {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const auto& u : units_) out.emplace_back(u.name(), u.flat().numel());
  return out;
}

size_t ShardedStrategy::unitOf(const torch::nn::Module& module) const {
  auto it = unit_of_module_.find(&module);
  if (it == unit_of_module_.end()) throw InvalidArgument("module is no shard unit");
  return it->second;
}

// ---- forward ------------------------------------------------------------------------------------

void ShardedStrategy::beforeForward(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t i = unitOf(module);
  if (torch::GradMode::is_enabled()) order_.record(i);
  units_[i].preForward(ctx_);
  if (options_.forward_prefetch && policy_.reshard_after_forward) {
    const size_t next = order_.afterInPreviousForward(i);
    if (next != ForwardOrder::kNone) units_[next].prefetch(ctx_);
  }
}

torch::Tensor ShardedStrategy::afterForward(const torch::nn::Module& module, torch::Tensor output) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t i = unitOf(module);
  if (units_[i].postForward(ctx_)) rested(i);
  if (output.requires_grad()) {
    output.register_hook([this, i](const torch::Tensor&) { preBackward(i); });
  }
  return output;
}

void ShardedStrategy::preBackward(size_t i) {
  std::lock_guard<std::mutex> lock(mu_);
  units_[i].preBackward(ctx_);
  if (options_.backward_prefetch == BackwardPrefetch::kPre) {
    const size_t next = order_.beforeInThisForward(i);
    if (next != ForwardOrder::kNone) units_[next].prefetch(ctx_);
  }
}

void ShardedStrategy::rested(size_t i) {
  optimizer_->allocateState(units_[i].optimizerShard());
  // What LibTorch says of a freed parameter (1.13 and 2.x), which says nothing of units.
  for (const char* freed : {"data is not allocated yet", "for storage of size 0"}) {
    addUncaughtErrorHint(
        freed,
        "cxxlaunch: a shard unit's parameters were used while they are freed: under ZeRO-3 and "
        "FSDP FULL_SHARD a unit is gathered only around its unitForward calls, so once it ran "
        "through cxxlaunch::runtime::unitForward(block, x, ...) it must always be called that "
        "way, never as block->forward(x) or block(x)");
  }
}

void ShardedStrategy::warnOfUnitsNeverRouted() {
  if (warned_never_routed_ || !policy_.reshard_after_forward) return;
  warned_never_routed_ = true;
  std::string names;
  size_t count = 0;
  for (const auto& item : model_->named_modules()) {
    for (const ShardUnit& u : units_) {
      if (u.module() != item.value().get() || u.routed()) continue;
      if (++count <= 4) names += std::string(count > 1 ? ", " : "") + "'" + item.key() + "'";
    }
  }
  if (count == 0 || backend_->rank() != 0) return;
  std::cerr << "cxxlaunch: warning: " << count << " module(s) the wrap policy chose as shard "
            << "units never ran through unitForward (" << names << (count > 4 ? ", ..." : "")
            << "), so their parameters stay whole on every rank: ZeRO-3's memory saving does not "
            << "happen for them. Call each as cxxlaunch::runtime::unitForward(block, x, ...) in "
            << "the model's forward (runtime/strategy/unit.h)\n";
}

// ---- backward -----------------------------------------------------------------------------------

void ShardedStrategy::beforeBackward(bool sync) {
  std::lock_guard<std::mutex> lock(mu_);
  sync_ = sync;
}

void ShardedStrategy::onGradientReady(size_t unit, size_t param) {
  std::lock_guard<std::mutex> lock(mu_);
  // Replicated gradients accumulate in param.grad() until the synchronising backward.
  if (!policy_.shard_gradients && !sync_) return;
  if (replicated_) used_[first_param_[unit] + param] = 1;
  markReady(unit, param);
}

void ShardedStrategy::markReady(size_t unit, size_t param) {
  const bool unit_done = readiness_->markReady(unit, param);
  ShardUnit& u = units_[unit];
  if (shared_grads_ && !u.fullGradient().defined()) {
    torch::Tensor lent = shared_grads_->lend(unit, u.flat().padded(), options_.compute_dtype);
    if (lent.defined()) u.useLentGradientBuffer(std::move(lent));
  }
  u.takeGradient(param, ctx_);
  if (unit_done) unitGradientsDone(unit);
  launchReady();
}

void ShardedStrategy::unitGradientsDone(size_t i) {
  // Every gradient of the unit is computed: backward reads its parameters no more.
  if (units_[i].postBackward(ctx_)) rested(i);
  if (options_.backward_prefetch == BackwardPrefetch::kPost) {
    const size_t next = order_.beforeInThisForward(i);
    if (next != ForwardOrder::kNone) units_[next].prefetch(ctx_);
  }
}

void ShardedStrategy::launchReady() {
  for (size_t i; (i = readiness_->nextToLaunch()) != GradientReadiness::kNone;) {
    // Replicated: all-reduced over every rank, waited for in afterBackward; sharded:
    // reduce-scattered over the shard group, at most kMaxReductionsInFlight at a time.
    units_[i].reduceGradients(ctx_);
    if (!policy_.shard_gradients) continue;
    in_flight_.push_back(i);
    while (in_flight_.size() > kMaxReductionsInFlight) completeOldestReduction();
  }
}

void ShardedStrategy::completeOldestReduction() {
  const size_t i = in_flight_.front();
  in_flight_.pop_front();
  units_[i].finishReduction(ctx_);
  if (shared_grads_) shared_grads_->giveBack(i);
}

void ShardedStrategy::afterBackward(bool sync) {
  std::lock_guard<std::mutex> lock(mu_);
  order_.backwardEnded();
  if (!policy_.shard_gradients && !sync) return;
  if (replicated_) return finishReplicatedBackward();
  // Parameters this backward did not reach (unused in this forward) contribute zeros, so that no
  // rank waits for a reduction another rank never starts.
  for (const auto& [unit, param] : readiness_->pending()) markReady(unit, param);
  if (!policy_.shard_gradients) {
    for (auto& u : units_) u.finishReduction(ctx_);
  }
  while (!in_flight_.empty()) completeOldestReduction();
  readiness_->reset();
  for (size_t i = 0; i < units_.size(); ++i) release(i);  // a unit prefetched but not used
}

// ---- optimizer step -----------------------------------------------------------------------------

double ShardedStrategy::clipGradNorm(double max_norm) {
  if (replicated_) return replicated_->clipGradNorm(max_norm);
  double squares = 0;
  for (auto& u : units_) squares += store_->gradientSquares(u);
  if (policy_.shard_optimizer) {  // each shard holds a part of the gradient
    shards_->allreduce(&squares, 1, DType::kFloat64, ReduceOp::kSum)->wait();
  }
  const double norm = std::sqrt(squares);
  const double coefficient = max_norm / (norm + 1e-6);
  if (max_norm > 0 && coefficient < 1) {
    for (auto& u : units_) store_->scaleGradient(u, static_cast<float>(coefficient));
  }
  return norm;
}

bool ShardedStrategy::unscaleGradients(double factor) {
  if (replicated_) return replicated_->unscaleGradients(factor);
  int32_t overflow = 0;
  for (auto& u : units_) {
    if (!store_->gradientFinite(u)) overflow = 1;
    store_->scaleGradient(u, static_cast<float>(factor));
  }
  backend_->allreduce(&overflow, 1, DType::kInt32, ReduceOp::kMax)->wait();
  return overflow == 0;
}

void ShardedStrategy::step() {
  if (replicated_) return replicated_->step();
  torch::NoGradGuard no_grad;
  optimizer_->beginStep();
  store_->step(units_);
  // Parameters up to date everywhere: gathered now, or (units resting sharded) at their next use.
  std::vector<WorkPtr> gathers;
  for (auto& u : units_) {
    if (WorkPtr gather = u.afterStep(ctx_)) gathers.push_back(std::move(gather));
  }
  for (auto& w : gathers) w->wait();
  warnOfUnitsNeverRouted();
}

void ShardedStrategy::zeroGrad() {
  if (replicated_) return replicated_->zeroGrad();
  for (auto& u : units_) u.zeroGradients(ctx_);
}

MemoryReport ShardedStrategy::memoryReport() const {
  MemoryReport report;
  if (replicated_) {
    replicated_->report(report);
    return report;
  }
  // cpu offload: the fp32 shards and the optimizer state are host memory, reported apart.
  const bool on_host = policy_.master == Placement::kHost;
  size_t& shards = on_host ? report.offloaded_to_cpu : report.parameters;
  size_t& gradient_shards = on_host ? report.offloaded_to_cpu : report.gradients;
  for (const auto& u : units_) {
    report.parameters += u.flat().residentBytes() + bytesOf(u.deviceShard());
    if (policy_.own_master) shards += bytesOf(u.master());
    report.gradients += u.gradientBufferBytes();
    if (policy_.own_gradient_shard) gradient_shards += bytesOf(u.gradientShard());
  }
  for (const auto& p : frozen_) report.parameters += bytesOf(p);
  (on_host ? report.offloaded_to_cpu : report.optimizer_state) += optimizer_->stateBytes();
  store_->report(report);
  if (pool_) report.kept_for_reuse = pool_->bytes();
  return report;
}

void ShardedStrategy::visitFullParameters(const ParameterVisitor& visit) {
  std::lock_guard<std::mutex> lock(mu_);
  torch::NoGradGuard no_grad;
  if (replicated_) return replicated_->visitFullParameters(visit);
  for (auto& u : units_) {  // one unit whole at a time
    torch::Tensor full;
    u.waitUnsharded();
    if (!policy_.shard_optimizer) {
      full = u.master();
    } else if (u.flat().resident() && !mixed()) {
      full = u.flat().full();
    } else {  // from the fp32 master shards: the precise values, not the compute copies
      full = torch::empty({u.flat().padded()}, torch::kFloat);
      const torch::Tensor master = store_->master(u);
      shards_
          ->allGather(master.data_ptr(), full.data_ptr(),
                      static_cast<size_t>(u.flat().shardNumel()), DType::kFloat32)
          ->wait();
    }
    for (size_t i = 0; i < u.flat().params().size(); ++i) {
      const auto& p = u.flat().params()[i];
      visit(u.flat().names()[i], full.narrow(0, u.flat().offset(i), p.numel()).view(p.sizes()));
    }
  }
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) visit(item.key(), item.value().detach());
  }
}

}  // namespace cxxlaunch::runtime
