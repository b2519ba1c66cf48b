// The Fake backend: the ranks of a world are threads of one process, meeting in a FakeWorld.
// Collectives are computed by the last rank to arrive, over every rank's buffers, with the same
// reductions (runtime/comm/reduce.h) as the real backends' CPU paths.

#include <cstring>
#include <functional>
#include <map>
#include <vector>

#include "common/error.h"
#include "runtime/comm/backend.h"
#include "runtime/comm/comm_thread.h"
#include "runtime/comm/reduce.h"

namespace cxxlaunch::runtime {

class FakeWorld {
 public:
  explicit FakeWorld(int size) : size_(size), args_(static_cast<size_t>(size)) {}

  int size() const { return size_; }

  // The world of one group of ranks, made by whichever member asks first.
  std::shared_ptr<FakeWorld> group(const std::string& key, int size) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& world = groups_[key];
    if (!world) world = std::make_shared<FakeWorld>(size);
    return world;
  }

  // Each rank deposits `arg`; the last to arrive runs `combine` over all of them; everyone
  // returns after it ran. Ranks must call in the same order.
  void meet(int rank, void* arg, const std::function<void(const std::vector<void*>&)>& combine) {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t generation = generation_;
    args_[static_cast<size_t>(rank)] = arg;
    if (++arrived_ == size_) {
      combine(args_);
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, std::chrono::minutes(5), [&] { return generation_ != generation; })) {
      throw TimeoutError("fake backend: rank " + std::to_string(rank) +
                         " waited 5 minutes for its peers");
    }
  }

 private:
  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<void*> args_;
  std::map<std::string, std::shared_ptr<FakeWorld>> groups_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

namespace {

struct Buffers {
  const void* in;
  void* out;
};

class FakeBackend final : public Backend {
 public:
  FakeBackend(std::shared_ptr<FakeWorld> world, int rank) : world_(std::move(world)), rank_(rank) {}

  int rank() const override { return rank_; }
  int worldSize() const override { return world_->size(); }
  std::string name() const override { return "fake"; }
  std::string transport() const override { return "threads"; }

  WorkPtr allreduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    return run(data, data, [=, n = worldSize()](const std::vector<void*>& all) {
      const size_t bytes = count * dtypeSize(dtype);
      std::vector<char> acc(bytes);
      std::memcpy(acc.data(), static_cast<Buffers*>(all[0])->in, bytes);
      for (size_t r = 1; r < all.size(); ++r) {
        reduceInto(acc.data(), static_cast<Buffers*>(all[r])->in, count, dtype, op);
      }
      if (op == ReduceOp::kAvg) divideBy(acc.data(), count, dtype, n);
      for (void* b : all) std::memcpy(static_cast<Buffers*>(b)->out, acc.data(), bytes);
    });
  }

  WorkPtr reduceScatter(const void* input, void* output, size_t count, DType dtype,
                        ReduceOp op) override {
    return run(input, output, [=, n = worldSize()](const std::vector<void*>& all) {
      const size_t bytes = count * dtypeSize(dtype);
      for (size_t r = 0; r < all.size(); ++r) {
        std::vector<char> acc(bytes);
        auto chunk = [&](size_t from) {
          return static_cast<const char*>(static_cast<Buffers*>(all[from])->in) + r * bytes;
        };
        std::memcpy(acc.data(), chunk(0), bytes);
        for (size_t from = 1; from < all.size(); ++from) {
          reduceInto(acc.data(), chunk(from), count, dtype, op);
        }
        if (op == ReduceOp::kAvg) divideBy(acc.data(), count, dtype, n);
        std::memcpy(static_cast<Buffers*>(all[r])->out, acc.data(), bytes);
      }
    });
  }

  WorkPtr allGather(const void* input, void* output, size_t count, DType dtype) override {
    return run(input, output, [=](const std::vector<void*>& all) {
      const size_t bytes = count * dtypeSize(dtype);
      for (void* to : all) {
        for (size_t from = 0; from < all.size(); ++from) {
          std::memcpy(static_cast<char*>(static_cast<Buffers*>(to)->out) + from * bytes,
                      static_cast<Buffers*>(all[from])->in, bytes);
        }
      }
    });
  }

  WorkPtr broadcast(void* data, size_t count, DType dtype, int root) override {
    return run(data, data, [=](const std::vector<void*>& all) {
      const size_t bytes = count * dtypeSize(dtype);
      const void* source = static_cast<Buffers*>(all[static_cast<size_t>(root)])->in;
      for (void* to : all) {
        if (static_cast<Buffers*>(to)->out != source) {
          std::memcpy(static_cast<Buffers*>(to)->out, source, bytes);
        }
      }
    });
  }

  WorkPtr barrier() override {
    return run(nullptr, nullptr, [](const std::vector<void*>&) {});
  }

  std::unique_ptr<Backend> subgroup(const std::vector<int>& ranks,
                                    const std::string& partition) override {
    const int rank = rankInGroup(ranks, rank_);
    return std::make_unique<FakeBackend>(
        world_->group(groupKey(ranks, partition), static_cast<int>(ranks.size())), rank);
  }

 private:
  WorkPtr run(const void* in, void* out, std::function<void(const std::vector<void*>&)> combine) {
    return thread_.submit([this, in, out, combine = std::move(combine)] {
      Buffers buffers{in, out};
      world_->meet(rank_, &buffers, combine);
    });
  }

  std::shared_ptr<FakeWorld> world_;
  int rank_;
  CommThread thread_;  // last: joined first, while the world is still alive
};

}  // namespace

std::shared_ptr<FakeWorld> makeFakeWorld(int world_size) {
  if (world_size < 1) throw InvalidArgument("fake world: size must be >= 1");
  return std::make_shared<FakeWorld>(world_size);
}

std::unique_ptr<Backend> makeFakeBackend(std::shared_ptr<FakeWorld> world, int rank) {
  if (rank < 0 || rank >= world->size()) throw InvalidArgument("fake backend: rank out of range");
  return std::make_unique<FakeBackend>(std::move(world), rank);
}

}  // namespace cxxlaunch::runtime
