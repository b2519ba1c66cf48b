#pragma once
// ShmCollectives: allreduce, reduce-scatter, all-gather and broadcast through shared memory, for
// worlds whose ranks all run on this host; memory bandwidth instead of TCP loopback and Gloo's
// per-segment handshakes. The Gloo backend uses it when it can and keeps TCP for everything else
// (several hosts). Two ways:
//  - Zero-copy: buffers from registerBuffer() are shared memory every rank maps. When every
//    rank's buffer lies there, each rank reduces its share of the buffer straight from the peers'
//    buffers and writes the result into all of them: no copy in, no copy out, one barrier before
//    and one after. DDP's gradient buckets live there (strategy/sharded.h).
//  - Otherwise (any rank's buffer is ordinary memory): through one segment, chunk by chunk, as
//    NCCL's SHM transport and DeepSpeed's CPU allreduce do: each rank copies its chunk into its
//    slot (a registered one is read in place), every rank reduces its share of the chunk from all
//    slots in rank order, and everyone copies the result out; two barriers per chunk.
// Internal to runtime/.
//
// Results are bitwise the same on every rank (one fixed reduction order). A peer that exits
// ends the waits of the others with PeerLost within ~50 ms; a silent one with TimeoutError. Ranks
// in different calls (another operation, dtype or count) all fail with CommunicationError naming
// each rank's call, at the call's first barrier.
// Thread-safety: one thread at a time (the backend's communication thread); the buffers
// registerBuffer returns may be released from any thread.

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

  // Collective: every rank asks for the same `bytes`. Returns this rank's part of a new
  // shared-memory segment that every rank maps (zeroed, page-aligned, its pages reserved and
  // mapped now): collectives whose buffers lie in such parts on every rank read and write the
  // peers' buffers in place (see above). The memory stays mapped while this object or the
  // returned pointer lives. nullptr on every rank alike when the segment cannot be made (no
  // space in /dev/shm): use ordinary memory then. Unlinked once every rank has it mapped, as the
  // main segment; named like it, so the launcher removes it after a crash in between.
  std::shared_ptr<void> registerBuffer(size_t bytes);
  // Whether [data, data + bytes) lies in one buffer registerBuffer returned on this rank.
  bool isRegistered(const void* data, size_t bytes) const;
  // Bytes this rank copied into its slot so far: none while every buffer is registered (the
  // tests' proof that no copy came back).
  uint64_t bytesCopiedIn() const { return copied_in_; }

  // This host as the ranks compare it: boot id and PID namespace (peers are watched by pid).
  static std::string thisHostKey();
  // The segment's header for `size` ranks: the barrier and each rank's current call.
  static size_t headerBytes(int size);

 private:
  struct Header;
  struct Call;
  struct Region;
  // Where a call's buffer lies: in registered region `region` at `offset` of each rank's part;
  // region -1: ordinary memory.
  struct Location {
    int64_t region = -1;
    uint64_t offset = 0;
  };
  enum class Op : int32_t {
    kAllreduce,
    kReduceScatter,
    kAllGather,
    kBroadcast,
    kBarrier,
    kRegister
  };
  Call* calls() const;
  void enter(Op op, DType dtype, size_t count, int64_t extra, Location where);
  Location locate(const void* data, size_t bytes) const;
  // After enter(): each rank's buffer of this call, nullptr for ranks whose buffer is not
  // registered. (Read once, before the call's last barrier: a peer's next call rewrites it.)
  std::vector<char*> peerBuffers() const;
  void reduceInPlace(const std::vector<char*>& buffers, size_t count, DType dtype, ReduceOp op);
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
  uint64_t copied_in_ = 0;   // bytes copied into this rank's slot
  // Every registered segment, in registration order (the same index on every rank); kept while
  // this object lives, so that a peer's buffer in it stays readable.
  std::vector<std::shared_ptr<Region>> regions_;
};

}  // namespace cxxlaunch::runtime
