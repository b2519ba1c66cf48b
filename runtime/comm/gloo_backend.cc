// The Gloo backend: CPU collectives over Gloo's TCP transport. Ranks connect a full mesh through
// our Store (a gloo::rendezvous::Store adapter), so the launcher's rendezvous server is all they
// need. Collectives run on one communication thread, in order, each with its own tag.

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "common/host.h"
#include "rendezvous/prefix_store.h"
#include "runtime/comm/backend.h"
#include "runtime/comm/comm_thread.h"
#include "runtime/comm/reduce.h"
#include "runtime/comm/shm_collectives.h"

namespace cxxlaunch::runtime {
namespace {

// Gloo's rendezvous speaks to our Store.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<rendezvous::Store> store, std::chrono::milliseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string value = store_->get(key, timeout_);
    return {value.begin(), value.end()};
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  std::shared_ptr<rendezvous::Store> store_;
  std::chrono::milliseconds timeout_;
};

class GlooBackend final : public Backend {
 public:
  explicit GlooBackend(const BackendOptions& options)
      : options_(options),
        rank_(options.rank),
        size_(options.world_size),
        timeout_(options.timeout) {
    where_ = " on rank " + std::to_string(rank_) + " of " + std::to_string(size_) + " (host " +
             hostName() + ")";
    try {
      gloo::transport::tcp::attr attr;
      attr.hostname = options.address;
      auto device = gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
      context->setTimeout(timeout_);
      GlooStoreAdapter store(
          std::make_shared<rendezvous::PrefixStore>(options.prefix + "/gloo", options.store),
          timeout_);
      context->connectFullMesh(store, device);
      context_ = std::move(context);
      // Every rank takes part, so that one with shared memory off keeps all of them on TCP.
      rendezvous::PrefixStore shm_store(options.prefix + "/shm", options.store);
      shm_ = ShmCollectives::connect(shm_store, {.rank = rank_,
                                                 .world_size = size_,
                                                 .timeout = timeout_,
                                                 .slot_bytes = 0,
                                                 .host_key = {},
                                                 .enabled = options.shared_memory});
    } catch (const TimeoutError& e) {
      throw TimeoutError("gloo: ranks did not meet" + where_ + ": " + e.what());
    } catch (const gloo::Exception& e) {
      throw CommunicationError("gloo: connecting the ranks failed" + where_ + ": " + e.what());
    }
  }

  int rank() const override { return rank_; }
  int worldSize() const override { return size_; }
  std::string name() const override { return "gloo"; }
  std::string transport() const override {
    // Shared memory carries the collectives and barriers; TCP the connection set-up.
    return shm_ ? "shared memory and tcp" : "tcp";
  }

  WorkPtr allreduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    return submit("allreduce",
                  [=, this](uint32_t tag) { allreduceNow(data, count, dtype, op, tag); });
  }

  WorkPtr reduceScatter(const void* input, void* output, size_t count, DType dtype,
                        ReduceOp op) override {
    return submit("reduce_scatter", [=, this](uint32_t tag) {
      if (shm_) return shm_->reduceScatter(input, output, count, dtype, op);
      // Gloo has no reduce-scatter in its new API: reduce everything, keep this rank's chunk.
      const size_t bytes = count * dtypeSize(dtype);
      std::vector<char> all(bytes * static_cast<size_t>(size_));
      std::memcpy(all.data(), input, all.size());
      allreduceNow(all.data(), count * static_cast<size_t>(size_), dtype, op, tag);
      std::memcpy(output, all.data() + static_cast<size_t>(rank_) * bytes, bytes);
    });
  }

  WorkPtr allGather(const void* input, void* output, size_t count, DType dtype) override {
    return submit("all_gather", [=, this](uint32_t tag) {
      if (shm_) return shm_->allGather(input, output, count, dtype);
      const size_t bytes = count * dtypeSize(dtype);
      gloo::AllgatherOptions opts(context_);
      // Gloo may read the input while it writes the output: keep them apart.
      std::vector<uint8_t> in(static_cast<const uint8_t*>(input),
                              static_cast<const uint8_t*>(input) + bytes);
      opts.setInput(in.data(), bytes);
      opts.setOutput(static_cast<uint8_t*>(output), bytes * static_cast<size_t>(size_));
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  std::shared_ptr<void> sharedBuffer(size_t bytes) override {
    if (!shm_) return nullptr;  // the same on every rank: connect() decided for all
    // Captured by value: a wait that times out returns while the job is still queued.
    auto buffer = std::make_shared<std::shared_ptr<void>>();
    submit("register_buffer", [buffer, bytes, this](uint32_t) {
      *buffer = shm_->registerBuffer(bytes);
    })->wait();
    return *buffer;
  }

  std::unique_ptr<Backend> subgroup(const std::vector<int>& ranks,
                                    const std::string& partition) override {
    const BackendOptions options = subgroupOptions(options_, ranks, partition);
    return std::make_unique<GlooBackend>(options);
  }

  WorkPtr broadcast(void* data, size_t count, DType dtype, int root) override {
    return submit("broadcast", [=, this](uint32_t tag) {
      if (size_ == 1) return;
      if (shm_) return shm_->broadcast(data, count, dtype, root);
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<uint8_t*>(data), count * dtypeSize(dtype));
      opts.setRoot(root);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  WorkPtr barrier() override {
    return submit("barrier", [=, this](uint32_t tag) {
      if (shm_) return shm_->barrierCall();
      gloo::BarrierOptions opts(context_);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  void allreduceNow(void* data, size_t count, DType dtype, ReduceOp op, uint32_t tag) {
    if (size_ == 1) return;  // a world of one: sum, max, min and average of one value is itself
    if (shm_) return shm_->allreduce(data, count, dtype, op);
    gloo::AllreduceOptions opts(context_);
    // Typed, so that Gloo cuts the buffer between elements and counts elements, not bytes.
    switch (dtype) {
      case DType::kFloat32:
        opts.setOutput(static_cast<float*>(data), count);
        break;
      case DType::kFloat64:
        opts.setOutput(static_cast<double*>(data), count);
        break;
      case DType::kFloat16:
      case DType::kBFloat16:
        opts.setOutput(static_cast<uint16_t*>(data), count);
        break;
      case DType::kInt32:
        opts.setOutput(static_cast<int32_t*>(data), count);
        break;
      case DType::kInt64:
        opts.setOutput(static_cast<int64_t*>(data), count);
        break;
      case DType::kUInt8:
        opts.setOutput(static_cast<uint8_t*>(data), count);
        break;
    }
    if (dtype == DType::kFloat32 && (op == ReduceOp::kSum || op == ReduceOp::kAvg)) {
      // Gloo's vectorised kernel for the common case.
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    } else {
      opts.setReduceFunction([dtype, op](void* c, const void* a, const void* b, size_t n) {
        if (c == a) return reduceInto(c, b, n, dtype, op);
        if (c == b) return reduceInto(c, a, n, dtype, op);  // our ops commute
        std::memcpy(c, a, n * dtypeSize(dtype));
        reduceInto(c, b, n, dtype, op);
      });
    }
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    gloo::allreduce(opts);
    if (op == ReduceOp::kAvg) divideBy(data, count, dtype, size_);
  }

  // Runs `op` on the communication thread with the next tag; maps Gloo's errors to ours.
  WorkPtr submit(const char* what, std::function<void(uint32_t)> op) {
    const uint32_t tag = next_tag_++;
    return thread_.submit([this, what, tag, op = std::move(op)] {
      if (broken_) {
        throw CommunicationError(std::string("gloo ") + what + where_ +
                                 ": an earlier collective failed: " + broken_reason_);
      }
      // Any failure breaks the backend for good; the message names the collective and rank.
      auto broke = [&](const std::exception& e) {
        broken_ = true;
        broken_reason_ = e.what();
        return std::string("gloo ") + what + where_ + ": " + e.what();
      };
      try {
        op(tag);
      } catch (const gloo::IoException& e) {
        const std::string message = broke(e);
        if (std::string(e.what()).find("Timed out") != std::string::npos) {
          throw TimeoutError(message + " (a peer did not answer within " +
                             std::to_string(timeout_.count()) + " ms)");
        }
        throw PeerLost(message + " (a peer closed its connection: did it die?)");
      } catch (const gloo::Exception& e) {
        throw CommunicationError(broke(e));
      } catch (const PeerLost& e) {  // from shared memory
        throw PeerLost(broke(e));
      } catch (const TimeoutError& e) {  // from shared memory
        throw TimeoutError(broke(e));
      }
    });
  }

  const BackendOptions options_;  // for subgroups
  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  std::string where_;
  std::shared_ptr<gloo::Context> context_;
  std::unique_ptr<ShmCollectives> shm_;  // all ranks on this host: allreduce, reduce-scatter
  std::atomic<uint32_t> next_tag_{1};
  bool broken_ = false;  // touched on the communication thread only
  std::string broken_reason_;
  CommThread thread_;  // last: stops first, while the context still exists
};

}  // namespace

std::unique_ptr<Backend> makeGlooBackend(const BackendOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    throw InvalidArgument("gloo: rank " + std::to_string(options.rank) + " outside world of " +
                          std::to_string(options.world_size));
  }
  if (!options.store) throw InvalidArgument("gloo: no store to meet the other ranks through");
  return std::make_unique<GlooBackend>(options);
}

}  // namespace cxxlaunch::runtime
