#pragma once
// ShmCollectives: allreduce, reduce-scatter, all-gather and broadcast through one shared-memory
// segment, for worlds whose ranks all run on this host. Each rank copies its data into its slot,
// every rank reduces its share of the chunk from all slots in rank order, and everyone copies the
// result out: two barriers per chunk, memory bandwidth instead of TCP loopback and Gloo's
// per-segment handshakes. NCCL's SHM transport and DeepSpeed's CPU allreduce do the same. The Gloo
// backend uses it when it can and keeps TCP for everything else (barriers, several hosts).
// Internal to runtime/.
//
// Results are bitwise the same on every rank (one fixed reduction order). A peer that exits
// ends the waits of the others with PeerLost within ~50 ms; a silent one with TimeoutError. Ranks
// in different calls (another operation, dtype or count) all fail with CommunicationError naming
// each rank's call, at the call's first barrier.
// Thread-safety: one thread at a time (the backend's communication thread).

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "rendezvous/store.h"
#include "runtime/comm/backend.h"

namespace cxxlaunch::runtime {

struct ShmOptions {
  int rank = 0;
  int world_size = 1;
  std::chrono::milliseconds timeout = std::chrono::minutes(5);  // per barrier
  size_t slot_bytes = 0;  // per rank and chunk; 0: chosen from the world size
  std::string host_key;   // ranks share memory only if equal; empty: this host's (boot, pid ns)
  bool enabled = true;    // false: declines, and so every rank stays on TCP (no rank waits)
};

class ShmCollectives {
 public:
  // Collective: every rank calls it with the same store, even one that has shared memory turned
  // off. Returns nullptr on every rank alike when a rank declines, the ranks are not all on one
  // host or the segment cannot be made (no /dev/shm, no space), so the caller keeps to TCP. The
  // segment is unlinked once all ranks hold it: nothing is left behind in /dev/shm, even after a
  // crash.
  static std::unique_ptr<ShmCollectives> connect(rendezvous::Store& store,
                                                 const ShmOptions& options);
  ~ShmCollectives();
  ShmCollectives(const ShmCollectives&) = delete;
  ShmCollectives& operator=(const ShmCollectives&) = delete;

  // In place: every rank ends with op over all ranks' data (kAvg: the sum divided by the size).
  void allreduce(void* data, size_t count, DType dtype, ReduceOp op);
  // `input` holds world_size chunks of `count`; rank r's `output` gets op over all chunks r.
  void reduceScatter(const void* input, void* output, size_t count, DType dtype, ReduceOp op);
  // `output` (world_size * count) gets every rank's `input` (count) in rank order. `input` may be
  // this rank's place in `output` (each chunk is copied in before any result is written).
  void allGather(const void* input, void* output, size_t count, DType dtype);
  // Every rank's `data` gets `root`'s, through half the segment at a time: the root fills one
  // half while the others copy the other out.
  void broadcast(void* data, size_t count, DType dtype, int root);
  // Returns once every rank called it (through the segment, not TCP: a rank in another
  // collective is then named at once, as above).
  void barrierCall();

  // This host as the ranks compare it: boot id and PID namespace (peers are watched by pid).
  static std::string thisHostKey();
  // The segment's header for `size` ranks: the barrier and each rank's current call.
  static size_t headerBytes(int size);

 private:
  struct Header;
  struct Call;
  enum class Op : int32_t { kAllreduce, kReduceScatter, kAllGather, kBroadcast, kBarrier };
  Call* calls() const;
  void enter(Op op, DType dtype, size_t count, int64_t extra);
  ShmCollectives(const ShmOptions& options, void* base, size_t bytes, std::vector<int> pids);

  char* slot(int rank) const;
  char* result() const;
  void barrier();
  void checkPeers() const;  // throws PeerLost when a peer process has exited

  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  const size_t slot_bytes_;
  void* base_;
  const size_t bytes_;
  Header* header_;
  std::vector<int> pids_;    // every rank's pid
  std::vector<int> pidfds_;  // the peers' (not ours); -1 where pidfd_open is missing
  uint64_t calls_ = 0;       // this rank's calls so far
};

}  // namespace cxxlaunch::runtime
