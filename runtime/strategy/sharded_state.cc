// ShardedStrategy's state views (runtime/state_view.h): what checkpoint/ saves, as a stream of
// this rank's shards (read back from nvme one unit at a time) or of every parameter whole on
// rank 0 (gathered one unit and one array at a time), and the fill of a load, unit by unit.

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <optional>

#include "common/host_memory.h"
#include "runtime/comm/tensor_ops.h"
#include "runtime/strategy/sharded.h"
#include "tensorfile/checkpoint_schema.h"

namespace cxxlaunch::runtime {

StateStream ShardedStrategy::stateStream(StateDictType type, bool with_frozen) {
  if (replicated_) return replicated_->stateStream(type, with_frozen);
  return type == StateDictType::kFull ? gatheredStream(with_frozen) : shardedStream(with_frozen);
}

StateCounters ShardedStrategy::stateCounters(int64_t optimizer_steps) {
  return replicated_ ? replicated_->stateCounters(optimizer_steps) : StateCounters{};
}

StateStream ShardedStrategy::gatheredStream(bool with_frozen) {
  // Without a sharded optimizer every rank holds everything: rank 0's views are already whole.
  if (!policy_.shard_optimizer) return shardedStream(with_frozen);
  StateStream state;
  const bool writes = backend_->rank() == 0;  // every rank gathers, rank 0 writes
  std::vector<std::string> arrays = {tensorfile::kParamArray};
  for (const auto& name : optimizer_->stateNames()) arrays.push_back(name);
  // Unit by unit, array by array (one array of one unit gathered at a time), each parameter.
  for (const auto& u : units_) {
    for (const auto& array : arrays) {
      for (size_t i = 0; writes && i < u.flat().params().size(); ++i) {
        const auto& p = u.flat().params()[i];
        state.layout.push_back({u.flat().names()[i], p.sizes().vec(), 0, p.numel(), {array}});
      }
    }
  }
  const bool frozen_written = writes && with_frozen;
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    if (frozen_written && !item.value().requires_grad()) {  // frozen: whole everywhere
      state.layout.push_back({item.key(),
                              item.value().sizes().vec(),
                              0,
                              item.value().numel(),
                              {tensorfile::kParamArray}});
    }
  }
  state.produce = [this, arrays, writes,
                   frozen_written](const std::function<void(const torch::Tensor&)>& write) {
    std::lock_guard<std::mutex> lock(mu_);
    torch::NoGradGuard no_grad;
    // The gathers run one array ahead of the writes: while rank 0 writes one array (the disk's
    // time), the next is gathered into the other of two buffers of the largest unit's array,
    // so that the disk does not wait for the gathers.
    int64_t largest = 0;
    std::vector<std::pair<ShardUnit*, size_t>> order;  // the arrays as they are written
    for (auto& u : units_) {
      largest = std::max(largest, u.flat().padded());
      for (size_t k = 0; k < arrays.size(); ++k) order.emplace_back(&u, k);
    }
    std::array<torch::Tensor, 2> buffers;
    struct Gather {
      torch::Tensor full;   // the unit's whole array, once `work` is done
      torch::Tensor shard;  // its input, kept until then (nvme's read buffers)
      WorkPtr work;
    };
    std::vector<torch::Tensor> optimizer_state;  // of the unit of the latest gather
    auto start = [&](size_t step) {
      auto [u, k] = order[step];
      if (k == 0) {
        u->waitUnsharded();
        optimizer_state = store_->state(*u);
        // Whole already (stages 1-2, a unit in use).
        if (u->flat().resident() && !mixed()) return Gather{u->flat().full(), {}, nullptr};
      }
      // The fp32 shards of every rank (of this node, under hybrid sharding).
      Gather g{{}, k == 0 ? store_->master(*u) : optimizer_state[k - 1], nullptr};
      torch::Tensor& buffer = buffers[step % 2];  // the one step - 2 wrote from
      if (!buffer.defined()) buffer = torch::empty({largest}, g.shard.options());
      g.full = buffer.narrow(0, 0, u->flat().padded());
      g.work = shards_->allGather(g.shard.data_ptr(), g.full.data_ptr(),
                                  static_cast<size_t>(u->flat().shardNumel()), DType::kFloat32);
      return g;
    };
    std::optional<Gather> next;
    // Never free a buffer a gather is still writing, whatever is thrown.
    struct Drain {
      std::optional<Gather>& gather;
      ~Drain() {
        if (!gather || !gather->work) return;
        try {
          gather->work->wait();
        } catch (const std::exception&) {  // the exception on its way says enough
        }
      }
    } drain{next};
    if (!order.empty()) next = start(0);
    for (size_t step = 0; step < order.size(); ++step) {
      Gather now = std::move(*next);
      next.reset();
      if (now.work) now.work->wait();
      if (step + 1 < order.size()) next = start(step + 1);
      const ShardUnit& u = *order[step].first;
      for (size_t i = 0; writes && i < u.flat().params().size(); ++i) {
        write(now.full.narrow(0, u.flat().offset(i), u.flat().params()[i].numel()));
      }
    }
    for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
      if (frozen_written && !item.value().requires_grad()) {
        write(item.value().detach().to(torch::kFloat).reshape({-1}));  // (held in 16 bits)
      }
    }
  };
  return state;
}

StateStream ShardedStrategy::shardedStream(bool with_frozen) {
  std::lock_guard<std::mutex> lock(mu_);
  StateStream stream;
  // Every element once: without a sharded optimizer every rank holds everything, under hybrid
  // sharding the other nodes hold copies of node 0's shards.
  if ((!policy_.shard_optimizer && backend_->rank() != 0) ||
      (replicas_ && replicas_->rank() != 0)) {
    stream.produce = [](const std::function<void(const torch::Tensor&)>&) {};
    return stream;
  }
  std::vector<std::string> arrays = {tensorfile::kParamArray};
  for (const auto& name : optimizer_->stateNames()) arrays.push_back(name);
  struct Piece {  // a view's elements in its unit's shard
    ShardUnit* unit;
    int64_t from, count;
  };
  std::vector<Piece> pieces;
  for (auto& u : units_) {
    const int64_t sb = u.flat().shardBegin(), sn = u.flat().shardNumel();
    for (size_t i = 0; i < u.flat().params().size(); ++i) {
      const auto& p = u.flat().params()[i];
      const int64_t off = u.flat().offset(i);
      const int64_t a = std::max(off, sb), b = std::min(off + p.numel(), sb + sn);
      if (a >= b) continue;
      stream.layout.push_back({u.flat().names()[i], p.sizes().vec(), a - off, b - off, arrays});
      pieces.push_back({&u, a - sb, b - a});
    }
  }
  std::vector<torch::Tensor> frozen;  // whole everywhere: rank 0 saves them
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    const torch::Tensor& p = item.value();
    if (p.requires_grad() || backend_->rank() != 0 || !with_frozen) continue;
    stream.layout.push_back({item.key(), p.sizes().vec(), 0, p.numel(), {tensorfile::kParamArray}});
    frozen.push_back(p);
  }
  stream.produce = [this, pieces = std::move(pieces), frozen = std::move(frozen)](
                       const std::function<void(const torch::Tensor&)>& write) {
    std::lock_guard<std::mutex> lock(mu_);
    torch::NoGradGuard no_grad;
    // One unit's master and optimizer state at a time: views of them where they are in memory,
    // read back where they rest on nvme.
    const ShardUnit* current = nullptr;
    torch::Tensor master;
    std::vector<torch::Tensor> state;
    for (const Piece& piece : pieces) {
      if (piece.unit != current) {
        current = piece.unit;
        master = torch::Tensor();
        state.clear();
        master = store_->master(*piece.unit);
        state = store_->state(*piece.unit);
      }
      write(master.narrow(0, piece.from, piece.count));
      for (const auto& s : state) write(s.narrow(0, piece.from, piece.count));
    }
    for (const auto& p : frozen) write(p.detach().to(torch::kFloat).reshape({-1}));
  };
  // Views of the masters and the optimizer state; nvme's read buffers, CPU memory, live as long
  // as the tensors handed out.
  stream.arrays_stay = true;
  return stream;
}

void ShardedStrategy::fillState(StateSource& source) {
  std::lock_guard<std::mutex> lock(mu_);
  torch::NoGradGuard no_grad;
  if (replicated_) return replicated_->fillState(source);
  const std::vector<std::string> names = optimizer_->stateNames();
  // Unit by unit: only one unit's state is staged at a time (nvme offload).
  for (auto& u : units_) {
    const int64_t sb = u.flat().shardBegin(), sn = u.flat().shardNumel();
    u.waitUnsharded();
    torch::Tensor master = store_->masterToOverwrite(u);
    std::vector<torch::Tensor> state = store_->stateToOverwrite(u);
    std::vector<StateRead> reads;  // the unit's, read together
    torch::Tensor current;         // the master as it is, where the source lacks a parameter
    for (size_t i = 0; i < u.flat().params().size(); ++i) {
      const auto& p = u.flat().params()[i];
      const std::string& name = u.flat().names()[i];
      const int64_t off = u.flat().offset(i);
      const int64_t a = std::max(off, sb), b = std::min(off + p.numel(), sb + sn);
      if (a >= b) continue;
      const auto shape = p.sizes().vec();
      if (source.has(name, tensorfile::kParamArray)) {
        reads.push_back({name, tensorfile::kParamArray, a - off, b - off, shape,
                         master.narrow(0, a - sb, b - a)});
      } else {  // a base model's export has no adapters: they keep their values
        if (!current.defined()) current = store_->master(u);
        if (current.data_ptr() != master.data_ptr()) {
          master.narrow(0, a - sb, b - a).copy_(current.narrow(0, a - sb, b - a));
        }
      }
      for (size_t k = 0; k < names.size(); ++k) {
        torch::Tensor into = state[k].narrow(0, a - sb, b - a);
        if (source.has(name, names[k])) {
          reads.push_back({name, names[k], a - off, b - off, shape, into});
        } else {  // saved before any step, or by another optimizer: a fresh start
          into.zero_();
        }
      }
    }
    // The parameters lie end to end: no read covers the state past them (the shard's padding),
    // which is zeroed, as a fresh state is, rather than left as whatever the memory held.
    const int64_t used = std::clamp(u.flat().numel() - sb, int64_t{0}, sn);
    for (auto& t : state) t.narrow(0, used, sn - used).zero_();
    // A read that fails (a corrupt or foreign checkpoint) stops the source's reading, not this
    // loop: the collectives below run on this rank as on the others, and the caller then throws
    // and loads another checkpoint.
    source.read(reads);
    store_->put(u, master, state);  // where they rest (nvme: written back)
    // A unit whole at rest takes its new shard now (a view of the master below stage 3 in fp32
    // has it already); one at rest sharded gathers it from the master when next used.
    if (u.flat().resident() && master.data_ptr() != u.flat().shard().data_ptr()) {
      u.flat().shard().copy_(master);
    }
    if (u.deviceShard().defined()) u.deviceShard().copy_(master);
    publish(u);
    if (policy_.return_freed_memory) releaseFreedHostMemory();  // this unit's staging first
  }
  // Frozen parameters, whole on every rank, one at a time: one held in 16 bits is read through a
  // float32 copy of itself, and the base's copies together would be twice the base. One the
  // source lacks keeps its values (a LoRA checkpoint's base, loaded by loadModel).
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    const torch::Tensor& p = item.value();
    if (p.requires_grad() || !source.has(item.key(), tensorfile::kParamArray)) continue;
    source.read({{item.key(), tensorfile::kParamArray, 0, p.numel(), p.sizes().vec(), p}});
  }
  if (!source.failed())
    optimizer_->setSteps(source.wholeCounter(tensorfile::kOptimizerStepsCounter, 0));
}

void ShardedStrategy::publish(ShardUnit& u) {
  // Whole units get every rank's new shard now; units at rest sharded get it at their next
  // gather (from the master).
  if (!policy_.shard_optimizer || !u.flat().resident()) return;
  if (u.rest(ctx_)) return;  // rests sharded: gathers it at its next use
  shards_
      ->allGather(u.flat().shard().data_ptr(), u.flat().full().data_ptr(),
                  static_cast<size_t>(u.flat().shardNumel()), dtypeOf(u.flat().full()))
      ->wait();
}

}  // namespace cxxlaunch::runtime
