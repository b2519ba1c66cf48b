// ShmCollectives' collectives (shm_collectives.h): allreduce, reduce-scatter, all-gather and
// broadcast, through the slots of the segment or, when every rank's buffer is registered, in
// place in the peers' buffers. The segment, its barrier and registration are in
// shm_collectives.cc.

#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/comm/reduce.h"
#include "runtime/comm/shm_collectives.h"

namespace cxxlaunch::runtime {
namespace {

bool allRegistered(const std::vector<char*>& buffers) {
  return std::find(buffers.begin(), buffers.end(), nullptr) == buffers.end();
}

// One block of a reduction: small enough to stay in L1 while every rank's part of it is added.
constexpr size_t kBlockBytes = 16 << 10;

}  // namespace

// Every rank's buffer is registered: this rank reduces its share of all of them, block by block
// in rank order (bitwise what the slot path computes), and writes the result into every buffer.
// The shares are disjoint, so nobody reads what another rank writes.
void ShmCollectives::reduceInPlace(const std::vector<char*>& buffers, size_t count, DType dtype,
                                   ReduceOp op) {
  const size_t elem = dtypeSize(dtype);
  const size_t lo = count * static_cast<size_t>(rank_) / static_cast<size_t>(size_);
  const size_t hi = count * static_cast<size_t>(rank_ + 1) / static_cast<size_t>(size_);
  if (size_ == 2) {  // one pass, no block: the two buffers are read once and written once
    reducePair(buffers[0] + lo * elem, buffers[1] + lo * elem, hi - lo, dtype, op);
    barrier();
    return;
  }
  alignas(64) char block[kBlockBytes];
  const size_t block_count = kBlockBytes / elem;
  for (size_t begin = lo; begin < hi; begin += block_count) {
    const size_t n = std::min(block_count, hi - begin);
    const size_t at = begin * elem;
    std::memcpy(block, buffers[0] + at, n * elem);
    for (int r = 1; r < size_; ++r) reduceInto(block, buffers[r] + at, n, dtype, op);
    if (op == ReduceOp::kAvg) divideBy(block, n, dtype, size_);
    for (int r = 0; r < size_; ++r) std::memcpy(buffers[r] + at, block, n * elem);
  }
  barrier();  // every share is written everywhere
}

void ShmCollectives::allreduce(void* data, size_t count, DType dtype, ReduceOp op) {
  const size_t elem = dtypeSize(dtype);
  const size_t chunk = slot_bytes_ / elem;
  auto* bytes = static_cast<char*>(data);
  const Location here = locate(data, count * elem);
  std::vector<char*> buffers;  // each rank's buffer where registered
  for (size_t done = 0; done < count; done += chunk) {
    const size_t n = std::min(chunk, count - done);
    if (here.region < 0) {
      std::memcpy(slot(rank_), bytes + done * elem, n * elem);
      copied_in_ += n * elem;
    }
    if (done == 0) {
      enter(Op::kAllreduce, dtype, count, static_cast<int64_t>(op), here);
      buffers = peerBuffers();
      if (allRegistered(buffers)) return reduceInPlace(buffers, count, dtype, op);
    } else {
      barrier();
    }
    // This rank's share of the chunk, reduced from every rank's data in rank order.
    auto from = [&](int r) { return buffers[r] ? buffers[r] + done * elem : slot(r); };
    const size_t lo = n * static_cast<size_t>(rank_) / static_cast<size_t>(size_);
    const size_t hi = n * static_cast<size_t>(rank_ + 1) / static_cast<size_t>(size_);
    char* mine = result() + lo * elem;
    if (size_ == 2) {
      reducePairInto(mine, from(0) + lo * elem, from(1) + lo * elem, hi - lo, dtype, op);
    } else {
      std::memcpy(mine, from(0) + lo * elem, (hi - lo) * elem);
      for (int r = 1; r < size_; ++r) reduceInto(mine, from(r) + lo * elem, hi - lo, dtype, op);
      if (op == ReduceOp::kAvg) divideBy(mine, hi - lo, dtype, size_);
    }
    barrier();
    // Nobody writes the result again before everyone has passed the next chunk's first barrier
    // (nor reads a registered buffer again: this chunk of it is done).
    std::memcpy(bytes + done * elem, result(), n * elem);
  }
}

void ShmCollectives::reduceScatter(const void* input, void* output, size_t count, DType dtype,
                                   ReduceOp op) {
  const size_t elem = dtypeSize(dtype);
  const auto size = static_cast<size_t>(size_);
  const auto* in = static_cast<const char*>(input);
  auto* out = static_cast<char*>(output);
  // An output inside the input (the in-place layout, output = input + rank * count) would be
  // written while the peers, or this rank's own later blocks, still read the input in place: such
  // an input goes through the slots, as an unregistered one does.
  const bool overlaps = out < in + size * count * elem && in < out + count * elem;
  const Location here = overlaps ? Location{} : locate(input, size * count * elem);
  // Zero-copy (every input registered): one piece, row `rank_` of every rank's input reduced in
  // rank order straight into the output, block by block. Otherwise pieces of a slot's size; a
  // registered input is still read in place.
  const size_t slot_piece = std::max<size_t>(1, slot_bytes_ / elem / size);  // of each row
  std::vector<char*> buffers;
  size_t piece = slot_piece;
  for (size_t done = 0; done < count; done += piece) {
    size_t n = std::min(piece, count - done);
    // Slot layout: world_size rows of `n` elements, row r for rank r's output.
    if (here.region < 0) {
      for (size_t r = 0; r < size; ++r) {
        std::memcpy(slot(rank_) + r * n * elem, in + (r * count + done) * elem, n * elem);
      }
      copied_in_ += size * n * elem;
    }
    if (done == 0) {
      enter(Op::kReduceScatter, dtype, count, static_cast<int64_t>(op), here);
      buffers = peerBuffers();
      if (allRegistered(buffers)) piece = n = count;
    } else {
      barrier();
    }
    // Rank r's piece of row `rank_`: in its input when registered, else in its slot.
    auto from = [&](int r, size_t begin) {
      return buffers[r] ? buffers[r] + (static_cast<size_t>(rank_) * count + done + begin) * elem
                        : slot(r) + (static_cast<size_t>(rank_) * n + begin) * elem;
    };
    const size_t block_count = size_ == 2 ? n : kBlockBytes / elem;  // two: one pass, no block
    for (size_t begin = 0; begin < n; begin += block_count) {
      const size_t m = std::min(block_count, n - begin);
      char* mine = out + (done + begin) * elem;
      if (size_ == 2) {
        reducePairInto(mine, from(0, begin), from(1, begin), m, dtype, op);
        continue;
      }
      std::memcpy(mine, from(0, begin), m * elem);
      for (int r = 1; r < size_; ++r) reduceInto(mine, from(r, begin), m, dtype, op);
      if (op == ReduceOp::kAvg) divideBy(mine, m, dtype, size_);
    }
    barrier();  // the slots and inputs are read: they may be written again
  }
}

void ShmCollectives::allGather(const void* input, void* output, size_t count, DType dtype) {
  const size_t elem = dtypeSize(dtype);
  const auto* in = static_cast<const char*>(input);
  auto* out = static_cast<char*>(output);
  const Location here = locate(input, count * elem);
  // Zero-copy (every input registered): each rank copies every input straight into its output,
  // in one piece. Otherwise chunks of a slot's size; a registered input is still read in place.
  std::vector<char*> buffers;
  size_t chunk = slot_bytes_ / elem;
  for (size_t done = 0; done < count; done += chunk) {
    size_t n = std::min(chunk, count - done);
    if (here.region < 0) {
      std::memcpy(slot(rank_), in + done * elem, n * elem);
      copied_in_ += n * elem;
    }
    if (done == 0) {
      enter(Op::kAllGather, dtype, count, -1, here);
      buffers = peerBuffers();
      if (allRegistered(buffers)) chunk = n = count;
    } else {
      barrier();
    }
    for (int r = 0; r < size_; ++r) {
      const char* from = buffers[r] ? buffers[r] + done * elem : slot(r);
      char* to = out + (static_cast<size_t>(r) * count + done) * elem;
      if (from != to) std::memcpy(to, from, n * elem);  // the same: in place, already there
    }
    barrier();  // the slots and inputs are read: they may be written again
  }
}

void ShmCollectives::broadcast(void* data, size_t count, DType dtype, int root) {
  if (count == 0) return;
  const size_t elem = dtypeSize(dtype);
  auto* bytes = static_cast<char*>(data);
  // Without a registered root buffer, one writer: the segment (every slot and the result area,
  // end to end) in two halves, so that the root fills one while the others copy the other out.
  // Between two barriers the root writes chunk k and the others read chunk k - 1; half k % 2 was
  // last read before the previous one.
  const size_t chunk = static_cast<size_t>(size_ + 1) * slot_bytes_ / 2 / elem;
  auto half = [&](size_t k) { return slot(0) + (k % 2) * chunk * elem; };
  const size_t chunks = (count + chunk - 1) / chunk;
  const Location here = rank_ == root ? locate(data, count * elem) : Location{};
  if (rank_ == root && here.region < 0) {
    std::memcpy(half(0), bytes, std::min(chunk, count) * elem);
    copied_in_ += std::min(chunk, count) * elem;
  }
  enter(Op::kBroadcast, dtype, count, root, here);
  if (const char* from = peerBuffers()[static_cast<size_t>(root)]) {
    // The root's buffer is registered: the others copy straight from it.
    if (rank_ != root) std::memcpy(bytes, from, count * elem);
    barrier();  // the root's buffer is read: it may be written again
    return;
  }
  for (size_t k = 1; k <= chunks; ++k) {
    if (rank_ == root && k < chunks) {
      std::memcpy(half(k), bytes + k * chunk * elem, std::min(chunk, count - k * chunk) * elem);
      copied_in_ += std::min(chunk, count - k * chunk) * elem;
    } else if (rank_ != root) {
      const size_t done = (k - 1) * chunk;
      std::memcpy(bytes + done * elem, half(k - 1), std::min(chunk, count - done) * elem);
    }
    barrier();
  }
}

void ShmCollectives::barrierCall() {
  enter(Op::kBarrier, DType::kUInt8, 0, -1, Location{});
  barrier();  // the calls are read: they may be written again
}

}  // namespace cxxlaunch::runtime
