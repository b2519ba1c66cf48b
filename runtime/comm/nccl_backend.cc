// The NCCL backend: GPU collectives on device pointers. Rank 0 creates the unique id and
// publishes it through the Store; the others read it; every rank calls ncclCommInitRank. The
// backend has its own CUDA stream, ordered after work already queued on the legacy default
// stream; each collective's Work is a CUDA event. Every CUDA and NCCL call is checked through one
// macro that names the call, the rank and the host.

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/host.h"
#include "rendezvous/store.h"
#include "runtime/comm/backend.h"

namespace cxxlaunch::runtime {
namespace {

#define CXXLAUNCH_CUDA_CHECK(call, where)                                                     \
  do {                                                                                        \
    cudaError_t cxxlaunch_err_ = (call);                                                      \
    if (cxxlaunch_err_ != cudaSuccess) {                                                      \
      throw ::cxxlaunch::CommunicationError(std::string(#call) + " failed" + (where) + ": " + \
                                            cudaGetErrorString(cxxlaunch_err_));              \
    }                                                                                         \
  } while (0)

#define CXXLAUNCH_NCCL_CHECK(call, where)                                                     \
  do {                                                                                        \
    ncclResult_t cxxlaunch_res_ = (call);                                                     \
    if (cxxlaunch_res_ != ncclSuccess && cxxlaunch_res_ != ncclInProgress) {                  \
      throw ::cxxlaunch::CommunicationError(std::string(#call) + " failed" + (where) + ": " + \
                                            ncclGetErrorString(cxxlaunch_res_));              \
    }                                                                                         \
  } while (0)

ncclDataType_t ncclType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    case DType::kUInt8:
      return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t ncclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

class NcclWork final : public Work {
 public:
  NcclWork(cudaEvent_t event, ncclComm_t comm, std::string where)
      : event_(event), comm_(comm), where_(std::move(where)) {}
  ~NcclWork() override { cudaEventDestroy(event_); }

  void wait(std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::microseconds(20);
    while (!done()) {
      ncclResult_t async_error = ncclSuccess;
      CXXLAUNCH_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async_error), where_);
      if (async_error != ncclSuccess && async_error != ncclInProgress) {
        throw PeerLost("nccl" + where_ + ": " + ncclGetErrorString(async_error));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        throw TimeoutError("nccl collective" + where_ + " did not complete within " +
                           std::to_string(timeout.count()) + " ms");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }

  bool done() const override {
    cudaError_t state = cudaEventQuery(event_);
    if (state == cudaErrorNotReady) return false;
    CXXLAUNCH_CUDA_CHECK(state, where_);
    return true;
  }

 private:
  cudaEvent_t event_;
  ncclComm_t comm_;
  std::string where_;
};

// NCCL reads and writes device memory only. The control values every strategy exchanges (a
// flag, a gradient norm, a few shapes) live in host memory, so a host pointer is staged through
// device memory: copied in before the collective, and the collective's result copied back before
// it returns (such a collective completes before its Work is handed out).
class HostStaging {
 public:
  explicit HostStaging(const std::string& where) : where_(where) {}
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;
  ~HostStaging() {
    for (auto& b : buffers_) cudaFree(b.device);
  }

  // `p` as NCCL can use it: `p` itself when it is device memory, else a device copy of its
  // `bytes` (filled from `p` when `in`, written back to it by finish() when `out`).
  void* use(const void* p, size_t bytes, bool in, bool out) {
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
      (void)cudaGetLastError();  // a plain host pointer on old drivers: clear the sticky error
      attributes.type = cudaMemoryTypeUnregistered;
    }
    if (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged) {
      return const_cast<void*>(p);
    }
    Buffer b{const_cast<void*>(p), nullptr, bytes, out};
    CXXLAUNCH_CUDA_CHECK(cudaMalloc(&b.device, std::max<size_t>(bytes, 1)), where_);
    buffers_.push_back(b);
    if (in) CXXLAUNCH_CUDA_CHECK(cudaMemcpy(b.device, p, bytes, cudaMemcpyHostToDevice), where_);
    return b.device;
  }

  // `work` as is when nothing was staged; else once it is done and the results are back.
  WorkPtr finish(WorkPtr work) {
    if (buffers_.empty()) return work;
    work->wait();
    for (const auto& b : buffers_) {
      if (b.out) {
        CXXLAUNCH_CUDA_CHECK(cudaMemcpy(b.host, b.device, b.bytes, cudaMemcpyDeviceToHost), where_);
      }
    }
    return work;
  }

 private:
  struct Buffer {
    void* host;
    void* device;
    size_t bytes;
    bool out;
  };
  const std::string& where_;
  std::vector<Buffer> buffers_;
};

class NcclBackend final : public Backend {
 public:
  explicit NcclBackend(const BackendOptions& options)
      : options_(options), rank_(options.rank), size_(options.world_size) {
    where_ = " on rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " (host " +
             hostName() + ", device " + std::to_string(options.device) + ")";
    CXXLAUNCH_CUDA_CHECK(cudaSetDevice(options.device), where_);
    device_ = options.device;
    // 1. Rank 0 makes the unique id and publishes it; 2. the others wait for it;
    // 3. everyone joins the communicator.
    ncclUniqueId id;
    const std::string key = options.prefix + "/nccl/unique_id";
    if (rank_ == 0) {
      CXXLAUNCH_NCCL_CHECK(ncclGetUniqueId(&id), where_);
      options.store->set(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
    } else {
      const std::string bytes = options.store->get(key, options.timeout);
      if (bytes.size() != sizeof(id)) throw CommunicationError("nccl: bad unique id" + where_);
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    CXXLAUNCH_NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_), where_);
    CXXLAUNCH_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), where_);
    CXXLAUNCH_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(int32_t)), where_);
  }

  ~NcclBackend() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (scratch_ != nullptr) cudaFree(scratch_);
  }

  int rank() const override { return rank_; }
  int worldSize() const override { return size_; }
  std::string name() const override { return "nccl"; }
  std::string transport() const override { return "nccl"; }

  WorkPtr allreduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    HostStaging staging(where_);
    void* d = staging.use(data, count * dtypeSize(dtype), true, true);
    return staging.finish(enqueue([&] {
      CXXLAUNCH_NCCL_CHECK(ncclAllReduce(d, d, count, ncclType(dtype), ncclOp(op), comm_, stream_),
                           where_);
    }));
  }

  WorkPtr reduceScatter(const void* input, void* output, size_t count, DType dtype,
                        ReduceOp op) override {
    HostStaging staging(where_);
    const size_t bytes = count * dtypeSize(dtype);
    const void* in = staging.use(input, bytes * static_cast<size_t>(size_), true, false);
    void* out = staging.use(output, bytes, false, true);
    return staging.finish(enqueue([&] {
      CXXLAUNCH_NCCL_CHECK(
          ncclReduceScatter(in, out, count, ncclType(dtype), ncclOp(op), comm_, stream_), where_);
    }));
  }

  WorkPtr allGather(const void* input, void* output, size_t count, DType dtype) override {
    HostStaging staging(where_);
    const size_t bytes = count * dtypeSize(dtype);
    const void* in = staging.use(input, bytes, true, false);
    void* out = staging.use(output, bytes * static_cast<size_t>(size_), false, true);
    return staging.finish(enqueue([&] {
      CXXLAUNCH_NCCL_CHECK(ncclAllGather(in, out, count, ncclType(dtype), comm_, stream_), where_);
    }));
  }

  WorkPtr broadcast(void* data, size_t count, DType dtype, int root) override {
    HostStaging staging(where_);
    void* d = staging.use(data, count * dtypeSize(dtype), true, true);
    return staging.finish(enqueue([&] {
      CXXLAUNCH_NCCL_CHECK(ncclBroadcast(d, d, count, ncclType(dtype), root, comm_, stream_),
                           where_);
    }));
  }

  std::unique_ptr<Backend> subgroup(const std::vector<int>& ranks,
                                    const std::string& partition) override {
    const BackendOptions options = subgroupOptions(options_, ranks, partition);
    return std::make_unique<NcclBackend>(options);  // its own unique id and communicator
  }

  WorkPtr barrier() override {
    return enqueue([&] {
      CXXLAUNCH_NCCL_CHECK(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_),
                           where_);
    });
  }

 private:
  // Orders the collective after work queued on the legacy default stream, issues it, and
  // returns an event recorded after it.
  template <typename Issue>
  WorkPtr enqueue(Issue&& issue) {
    std::lock_guard<std::mutex> lock(mu_);
    CXXLAUNCH_CUDA_CHECK(cudaSetDevice(device_), where_);
    cudaEvent_t ready, done;
    CXXLAUNCH_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), where_);
    CXXLAUNCH_CUDA_CHECK(cudaEventRecord(ready, nullptr), where_);
    CXXLAUNCH_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0), where_);
    cudaEventDestroy(ready);
    issue();
    CXXLAUNCH_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), where_);
    CXXLAUNCH_CUDA_CHECK(cudaEventRecord(done, stream_), where_);
    return std::make_shared<NcclWork>(done, comm_, where_);
  }

  const BackendOptions options_;  // for subgroups
  const int rank_;
  const int size_;
  int device_ = 0;
  std::string where_;
  std::mutex mu_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
};

}  // namespace

bool ncclCompiledIn() { return true; }

std::unique_ptr<Backend> makeNcclBackend(const BackendOptions& options) {
  if (!options.store) throw InvalidArgument("nccl: no store to exchange the unique id through");
  return std::make_unique<NcclBackend>(options);
}

}  // namespace cxxlaunch::runtime
