// NvmeStore (shard_store.h): the sharded engine's nvme offload, ZeRO-Infinity. The swap files,
// the optimizer step streamed through memory piece by piece, and the gradient shards swapped out
// as they are reduced.
//
// What rests in the files (runtime/offload/nvme_file.h), per unit:
//   param file     the fp32 master shard (offload_param nvme, stage 3);
//   state file     the optimizer's state arrays, one after another (offload_optimizer nvme);
//   gradient file  the fp32 gradient shard (offload_optimizer nvme at stage 2-3), written when a
//                  unit's reduction completes, added to while gradients accumulate, read by the
//                  step; DeepSpeed swaps gradients the same way. What clipping and the loss
//                  scaler need of it (its sum of squares, whether it is finite) is computed on its
//                  way out, and their scaling is applied when it is read back.
// Memory: three staging slots of one piece (master, state arrays, gradient: kPiece elements
// each) whatever the size of the largest unit, plus two gradient pieces: a 32000-word embedding
// costs no more to step than a decoder layer.

#include <torch/torch.h>

#include <algorithm>
#include <cstring>

#include "runtime/optim/device_kernels.h"
#include "runtime/strategy/shard_store.h"

namespace cxxlaunch::runtime {
namespace {

// Elements per piece: 8 MiB of float32, a multiple of NvmeFile::kAlignment / 4 so that every
// piece of a unit starts on an aligned offset of its region.
constexpr int64_t kPiece = int64_t{1} << 21;
static_assert(kPiece * 4 % NvmeFile::kAlignment == 0);

size_t regionBytes(int64_t numel) { return NvmeFile::roundUp(static_cast<size_t>(numel) * 4); }

torch::Tensor floats(float* at, int64_t numel) {
  return torch::from_blob(at, {numel}, torch::kFloat);
}

}  // namespace

NvmeStore::NvmeStore(ShardOptimizer& optimizer, torch::TensorOptions options, bool gradients_too,
                     const std::string& optimizer_dir, const std::string& param_dir,
                     const std::vector<ShardUnit>& units, const std::vector<int64_t>& shard_numels)
    : MemoryStore(optimizer, options, /*free_gradients_between_steps=*/false) {
  for (const int64_t n : shard_numels) largest_shard_ = std::max(largest_shard_, n);
  if (!param_dir.empty()) {
    param_file_ = std::make_unique<NvmeFile>(param_dir, "offload_param_nvme_path");
  }
  if (!optimizer_dir.empty() && optimizer_.stateArrays() > 0) {
    state_file_ = std::make_unique<NvmeFile>(optimizer_dir, "offload_optimizer_nvme_path");
  }
  if (!optimizer_dir.empty() && gradients_too) {
    grad_file_ = std::make_unique<NvmeFile>(optimizer_dir, "offload_optimizer_nvme_path");
  }
  for (size_t i = 0; i < units.size(); ++i) {
    Regions& r = regions_[&units[i]];
    const size_t bytes = regionBytes(shard_numels[i]);
    if (param_file_) r.master = param_file_->reserve(bytes);
    if (state_file_) r.state = state_file_->reserve(optimizer_.stateArrays() * bytes);
    if (grad_file_) r.gradient = grad_file_->reserve(bytes);
  }
  // Before the first step: a disk that cannot hold it all fails here. The state starts as the
  // file's zeros.
  for (auto* file : {param_file_.get(), state_file_.get(), grad_file_.get()}) {
    if (file != nullptr) file->allocate();
  }
  // The staging slots come with the first step: a job that only loads and evaluates never holds
  // them.
}

size_t NvmeStore::pieceBytes() const { return regionBytes(std::min(largest_shard_, kPiece)); }

void NvmeStore::settle(ShardUnit& u) {
  if (!param_file_) return;
  put(u, u.master(), {});  // the fp32 master moves out
  u.setMaster(torch::Tensor());
}

torch::Tensor NvmeStore::master(ShardUnit& u) {
  if (!param_file_) return u.master();
  AlignedBuffer buffer = alignedBuffer(static_cast<size_t>(u.flat().shardNumel()));
  param_file_->read(regions(u).master, buffer.data.get(), buffer.bytes)->wait();
  return torch::from_blob(
      buffer.data.get(), {u.flat().shardNumel()}, [keep = buffer.data](void*) {}, torch::kFloat);
}

std::vector<torch::Tensor> NvmeStore::state(ShardUnit& u) {
  if (!state_file_) return MemoryStore::state(u);
  const int64_t sn = u.flat().shardNumel();
  const size_t bytes = regionBytes(sn);
  const size_t arrays = optimizer_.stateArrays();
  AlignedBuffer buffer = alignedBuffer(arrays * bytes / 4);
  state_file_->read(regions(u).state, buffer.data.get(), arrays * bytes)->wait();
  std::vector<torch::Tensor> out;
  for (size_t a = 0; a < arrays; ++a) {
    out.push_back(torch::from_blob(
        reinterpret_cast<char*>(buffer.data.get()) + a * bytes, {sn},
        [keep = buffer.data](void*) {}, torch::kFloat));
  }
  return out;
}

torch::Tensor NvmeStore::masterToOverwrite(ShardUnit& u) {
  return param_file_ ? torch::zeros({u.flat().shardNumel()}) : u.master();
}

std::vector<torch::Tensor> NvmeStore::stateToOverwrite(ShardUnit& u) {
  if (!state_file_) return MemoryStore::stateToOverwrite(u);
  std::vector<torch::Tensor> state;
  for (size_t k = 0; k < optimizer_.stateArrays(); ++k) {
    state.push_back(torch::zeros({u.flat().shardNumel()}));
  }
  return state;
}

void NvmeStore::put(ShardUnit& u, const torch::Tensor& master,
                    const std::vector<torch::Tensor>& state) {
  const int64_t sn = u.flat().shardNumel();
  const size_t bytes = regionBytes(sn);
  // One array at a time: a unit's state is never staged whole.
  AlignedBuffer staging;
  auto write = [&](NvmeFile& file, int64_t at, const torch::Tensor& values) {
    if (!staging.data) staging = alignedBuffer(bytes / 4);
    std::memcpy(staging.data.get(), values.data_ptr<float>(), static_cast<size_t>(sn) * 4);
    file.write(at, staging.data.get(), bytes)->wait();
  };
  if (param_file_ && master.defined()) write(*param_file_, regions(u).master, master);
  if (state_file_) {
    for (size_t k = 0; k < state.size(); ++k) {
      write(*state_file_, regions(u).state + static_cast<int64_t>(k * bytes), state[k]);
    }
  }
}

void NvmeStore::addGradient(ShardUnit& u, const torch::Tensor& incoming) {
  if (!grad_file_) return MemoryStore::addGradient(u, incoming);
  Regions& g = regions(u);
  while (grad_pieces_.size() < 2) grad_pieces_.push_back(alignedBuffer(pieceBytes() / 4));
  const int64_t sn = u.flat().shardNumel();
  std::array<WorkPtr, 2> writes;  // one piece is written while the next is made
  double squares = 0;
  bool finite = true;
  for (int64_t begin = 0, k = 0; begin < sn; begin += kPiece, ++k) {
    const int64_t n = std::min(kPiece, sn - begin);
    WorkPtr& previous = writes[k % 2];
    if (previous) previous->wait();
    float* at = grad_pieces_[k % 2].data.get();
    torch::Tensor piece = floats(at, n);
    const torch::Tensor part = incoming.narrow(0, begin, n);
    if (g.written) {  // accumulating: what the earlier micro-steps left, scaled as it stands
      grad_file_->read(g.gradient + begin * 4, at, regionBytes(n))->wait();
      if (g.factor != 1) piece.mul_(g.factor);
      piece.add_(part.to(piece.device()));
    } else {
      piece.copy_(part);
    }
    squares += device_kernels::sumOfSquares(piece);
    finite = finite && device_kernels::allFinite(piece);
    previous = grad_file_->write(g.gradient + begin * 4, at, regionBytes(n));
  }
  for (auto& w : writes) {
    if (w) w->wait();
  }
  g.written = true;
  g.squares = squares;
  g.finite = finite;
  g.factor = 1;
}

double NvmeStore::gradientSquares(ShardUnit& u) {
  if (!grad_file_) return MemoryStore::gradientSquares(u);
  const Regions& g = regions(u);
  return g.squares * g.factor * g.factor;
}

bool NvmeStore::gradientFinite(ShardUnit& u) {
  return grad_file_ ? regions(u).finite : MemoryStore::gradientFinite(u);
}

void NvmeStore::scaleGradient(ShardUnit& u, float factor) {
  if (!grad_file_) return MemoryStore::scaleGradient(u, factor);
  regions(u).factor *= factor;
}

void NvmeStore::zeroGradient(ShardUnit& u) {
  if (!grad_file_) return MemoryStore::zeroGradient(u);
  Regions& g = regions(u);
  g = {.master = g.master, .state = g.state, .gradient = g.gradient};  // the file's values: zeros
}

void NvmeStore::step(std::vector<ShardUnit>& units) {
  struct Piece {
    ShardUnit* unit;
    int64_t begin, end;
  };
  std::vector<Piece> pieces;
  for (auto& u : units) {
    const int64_t sn = u.flat().shardNumel();
    for (int64_t b = 0; b < sn; b += kPiece) pieces.push_back({&u, b, std::min(b + kPiece, sn)});
  }
  // A slot holds one piece's [master | state arrays | gradient], each what rests in a file.
  const size_t arrays = state_file_ ? optimizer_.stateArrays() : 0;
  const size_t first_state = param_file_ ? 1 : 0, gradient = first_state + arrays;
  const size_t per_slot = gradient + (grad_file_ ? 1 : 0);
  while (slots_.size() < 3) slots_.push_back(alignedBuffer(per_slot * pieceBytes() / 4));
  auto at = [&](size_t k, size_t array) {
    return reinterpret_cast<float*>(reinterpret_cast<char*>(slots_[k % 3].data.get()) +
                                    array * pieceBytes());
  };
  auto load = [&](size_t k) {
    std::vector<WorkPtr> reads;
    const Piece& p = pieces[k];
    const Regions& r = regions(*p.unit);
    const int64_t offset = p.begin * 4;
    const size_t bytes = regionBytes(p.end - p.begin);
    if (param_file_) reads.push_back(param_file_->read(r.master + offset, at(k, 0), bytes));
    for (size_t a = 0; a < arrays; ++a) {
      const int64_t array_at =
          r.state + static_cast<int64_t>(a * regionBytes(p.unit->flat().shardNumel()));
      reads.push_back(state_file_->read(array_at + offset, at(k, first_state + a), bytes));
    }
    if (grad_file_ && r.written) {
      reads.push_back(grad_file_->read(r.gradient + offset, at(k, gradient), bytes));
    } else if (grad_file_) {  // no gradient since the last zeroGradient: zeros, as in memory
      std::memset(at(k, gradient), 0, bytes);
    }
    return reads;
  };
  auto finish = [](std::vector<WorkPtr>& works) {
    for (auto& w : works) w->wait();
    works.clear();
  };
  std::array<std::vector<WorkPtr>, 3> writes;
  std::vector<WorkPtr> reads = load(0);
  for (size_t k = 0; k < pieces.size(); ++k) {
    finish(reads);
    if (k + 1 < pieces.size()) {  // piece k+1's slot was piece k-2's: its writes must be done
      finish(writes[(k + 1) % 3]);
      reads = load(k + 1);
    }
    const Piece& p = pieces[k];
    ShardUnit& u = *p.unit;
    const Regions& r = regions(u);
    const int64_t n = p.end - p.begin;
    float* master = param_file_ ? at(k, 0) : u.master().data_ptr<float>() + p.begin;
    std::vector<float*> state;
    for (size_t a = 0; a < arrays; ++a) state.push_back(at(k, first_state + a));
    float* grad = grad_file_ ? at(k, gradient) : gradShard(u).data_ptr<float>() + p.begin;
    if (grad_file_ && r.factor != 1) device_kernels::scaleInPlace(floats(grad, n), r.factor);
    optimizer_.stepRange(u.optimizerShard(), p.begin, p.end, master, grad,
                         state_file_ ? state.data() : nullptr);
    auto& written = writes[k % 3];
    const int64_t offset = p.begin * 4;
    const size_t bytes = regionBytes(n);
    if (param_file_) {
      if (!u.routed()) {  // whole at rest: its own shard of the buffer is the gather's input
        u.flat().shard().narrow(0, p.begin, n).copy_(floats(master, n));
      }
      written.push_back(param_file_->write(r.master + offset, master, bytes));
    }
    for (size_t a = 0; a < arrays; ++a) {
      const int64_t array_at =
          r.state + static_cast<int64_t>(a * regionBytes(u.flat().shardNumel()));
      written.push_back(state_file_->write(array_at + offset, state[a], bytes));
    }
  }
  for (auto& w : writes) finish(w);
}

void NvmeStore::report(MemoryReport& report) const {
  for (const auto& slot : slots_) report.optimizer_state += slot.bytes;
  for (const auto& piece : grad_pieces_) report.gradients += piece.bytes;
  for (const auto* file : {param_file_.get(), state_file_.get(), grad_file_.get()}) {
    if (file != nullptr) report.offloaded += file->size();
  }
}

}  // namespace cxxlaunch::runtime
