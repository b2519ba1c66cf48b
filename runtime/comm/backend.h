#pragma once
// Backend: collective communication among the ranks of a job, on flat buffers.
//
// Every collective is asynchronous: it returns a Work at once, and the operation runs on the
// backend's own communication thread (Gloo, Fake) or stream (NCCL), in the order the calls were
// made. All ranks must issue the same collectives in the same order. Buffers must stay alive and
// untouched until the Work completes. Element types are erased at the interface (pointer, count,
// DType), as in Gloo; runtime/comm/tensor_ops.h adds at::Tensor conveniences.
//
// Errors: a failed or timed-out collective makes Work::wait throw CommunicationError, PeerLost
// or TimeoutError naming the operation, the rank and the host. After such an error the backend is
// broken: every later collective fails too.
//
// Thread-safety: a Backend may be called from several threads (autograd's and the trainer's);
// calls are serialised in the order they reach it.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cxxlaunch::rendezvous {
class Store;
}

namespace cxxlaunch::runtime {

enum class DType { kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8 };
size_t dtypeSize(DType dtype);
const char* dtypeName(DType dtype);

enum class ReduceOp { kSum, kAvg, kMax, kMin };

class Work {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::minutes(30);
  virtual ~Work() = default;
  // Blocks until done; rethrows the collective's error. Throws TimeoutError after `timeout`.
  virtual void wait(std::chrono::milliseconds timeout = kDefaultTimeout) = 0;
  virtual bool done() const = 0;
};
using WorkPtr = std::shared_ptr<Work>;

struct BackendOptions {
  int rank = 0;
  int world_size = 1;
  // Where ranks meet to connect (Gloo addresses, the NCCL unique id); keys go under `prefix`.
  std::shared_ptr<rendezvous::Store> store;
  std::string prefix = "backend";
  std::string address = "127.0.0.1";  // this rank's address, reachable by the others (Gloo)
  int device = -1;                    // CUDA device (NCCL); -1: the local rank's
  std::chrono::milliseconds timeout = std::chrono::minutes(5);  // per collective
  // Gloo: when every rank runs on this host, allreduce, reduce-scatter and all-gather go
  // through shared memory instead of TCP loopback (runtime/comm/shm_collectives.h).
  bool shared_memory = true;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual int rank() const = 0;
  virtual int worldSize() const = 0;
  virtual std::string name() const = 0;
  // How the data travels, for tables and logs: "tcp", "shared memory and tcp", "nvlink/ib"...
  virtual std::string transport() const = 0;

  // In place: every rank ends with op(data of all ranks).
  virtual WorkPtr allreduce(void* data, size_t count, DType dtype, ReduceOp op) = 0;
  // `input` holds world_size chunks of `count` elements; rank r's `output` (count elements) gets
  // op over every rank's chunk r.
  virtual WorkPtr reduceScatter(const void* input, void* output, size_t count, DType dtype,
                                ReduceOp op) = 0;
  // `output` (world_size * count elements) gets every rank's `input` (count), in rank order.
  virtual WorkPtr allGather(const void* input, void* output, size_t count, DType dtype) = 0;
  // In place: every rank ends with root's data.
  virtual WorkPtr broadcast(void* data, size_t count, DType dtype, int root) = 0;
  virtual WorkPtr barrier() = 0;

  // Memory for collective buffers that this backend reads and writes where it lies, with no copy
  // in or out: shared memory every rank of one host maps (Gloo with shared memory). A
  // collective: every rank asks for the same `bytes`, on the calling thread, in the order of its
  // other collectives. nullptr on every rank alike where there is none (NCCL, several hosts,
  // shared memory off, a full /dev/shm): use ordinary memory then, which works as well, through
  // copies. The memory (zeroed, page-aligned) lives while the pointer or the backend does.
  virtual std::shared_ptr<void> sharedBuffer(size_t /*bytes*/) { return nullptr; }

  // A backend over the ranks `ranks` (ascending ranks of this backend, this one among them),
  // where this rank is its index in `ranks`: hybrid sharding's groups inside a node and across
  // nodes. Every member calls it with the same `ranks` and `partition` (the name of one way of
  // cutting the world into disjoint groups, so that two cuts never meet); it returns once the
  // group is connected. Throws InvalidArgument when this rank is not in `ranks`.
  virtual std::unique_ptr<Backend> subgroup(const std::vector<int>& ranks,
                                            const std::string& partition) = 0;
};

// The index of `rank` in `ranks`, checked; and the key naming one group of a partition.
int rankInGroup(const std::vector<int>& ranks, int rank);
std::string groupKey(const std::vector<int>& ranks, const std::string& partition);
// A subgroup's options: its rank and size, and its keys under the group's own prefix.
BackendOptions subgroupOptions(const BackendOptions& world, const std::vector<int>& ranks,
                               const std::string& partition);

// Gloo over TCP (CPU memory). Connects a full mesh through options.store; throws
// CommunicationError or TimeoutError when the ranks cannot meet within options.timeout.
std::unique_ptr<Backend> makeGlooBackend(const BackendOptions& options);

// NCCL (CUDA memory). Rank 0 publishes the unique id through options.store. Throws
// InvalidArgument when cxxlaunch was built without CUDA and NCCL.
std::unique_ptr<Backend> makeNcclBackend(const BackendOptions& options);
bool ncclCompiledIn();

// The ranks of one process, as threads: for tests of everything above the backend. Create one
// FakeWorld of `world_size` and give each thread makeFakeBackend(world, rank).
class FakeWorld;
std::shared_ptr<FakeWorld> makeFakeWorld(int world_size);
std::unique_ptr<Backend> makeFakeBackend(std::shared_ptr<FakeWorld> world, int rank);

}  // namespace cxxlaunch::runtime
