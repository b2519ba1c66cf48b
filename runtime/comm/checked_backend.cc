#include "runtime/comm/checked_backend.h"

#include <algorithm>
#include <sstream>
#include <vector>

#include "common/error.h"

namespace cxxlaunch::runtime {
namespace {

constexpr size_t kHistory = 16;

enum class Op : int64_t { kAllreduce, kReduceScatter, kAllGather, kBroadcast, kBarrier };
const char* opName(Op op) {
  switch (op) {
    case Op::kAllreduce:
      return "allreduce";
    case Op::kReduceScatter:
      return "reduceScatter";
    case Op::kAllGather:
      return "allGather";
    case Op::kBroadcast:
      return "broadcast";
    case Op::kBarrier:
      return "barrier";
  }
  return "?";
}

// One call, as the ranks compare it (debug mode) and the history records it.
struct Call {
  int64_t seq = 0;
  Op op = Op::kBarrier;
  DType dtype = DType::kUInt8;
  int64_t count = 0;
  int64_t extra = -1;  // the reduce op, or the broadcast's root
  bool done = false;

  std::string str() const {
    std::ostringstream out;
    out << "#" << seq << " " << opName(op);
    if (op != Op::kBarrier) out << " " << dtypeName(dtype) << " x" << count;
    if (op == Op::kBroadcast) out << " from rank " << extra;
    return out.str();
  }
  bool sameAs(const Call& other) const {
    return op == other.op && dtype == other.dtype && count == other.count && extra == other.extra;
  }
};

// This rank's history in one group, shared by the backend and its pending works.
class Tracker {
 public:
  Tracker(CheckOptions options, int rank, int world)
      : options_(std::move(options)), rank_(rank), world_(world) {}

  int64_t record(Call call) {
    std::lock_guard<std::mutex> lock(mu_);
    call.seq = ++seq_;
    history_.push_back(call);
    if (history_.size() > kHistory) history_.pop_front();
    return call.seq;
  }

  void completed(int64_t seq) {
    std::lock_guard<std::mutex> lock(mu_);
    for (Call& c : history_) {
      if (c.seq == seq) c.done = true;
    }
  }

  // A timed-out wait: the error that says where every rank is.
  [[noreturn]] void timedOut(int64_t seq, const TimeoutError& error) {
    std::string mine, history;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const Call& c : history_) {
        if (c.seq == seq) mine = c.str();
        history += "\n    " + c.str() + (c.done ? "" : "  (not completed)");
      }
    }
    const std::string where = options_.store ? whereEveryoneIs(seq, mine) : "";
    throw TimeoutError(std::string(error.what()) + "\n  rank " + std::to_string(rank_) +
                       " timed out in " + mine + where + "\n  its last collectives:" + history);
  }

 private:
  // Publishes this rank's position, then reads the others' for up to report_wait.
  std::string whereEveryoneIs(int64_t seq, const std::string& mine) {
    const std::string key = options_.prefix + "/timed_out/";
    try {
      options_.store->set(key + std::to_string(rank_), mine);
    } catch (const std::exception&) {
      return "";  // no store to tell the others through: the history alone
    }
    const auto deadline = std::chrono::steady_clock::now() + options_.report_wait;
    std::string out;
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) continue;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      try {
        const std::string theirs = options_.store->get(
            key + std::to_string(r), std::max(left, std::chrono::milliseconds(1)));
        const bool behind = theirs.rfind('#', 0) == 0 && std::stoll(theirs.substr(1)) < seq;
        out += "\n  rank " + std::to_string(r) + ": timed out in " + theirs +
               (behind ? " (behind: it never reached #" + std::to_string(seq) + ")" : "");
      } catch (const std::exception&) {
        out += "\n  rank " + std::to_string(r) +
               ": no report (behind: busy outside collectives, stopped, or gone)";
      }
    }
    return out;
  }

  const CheckOptions options_;
  const int rank_, world_;
  std::mutex mu_;
  int64_t seq_ = 0;
  std::deque<Call> history_;
};

class CheckedWork final : public Work {
 public:
  CheckedWork(WorkPtr inner, std::shared_ptr<Tracker> tracker, int64_t seq,
              std::shared_ptr<Heartbeat> heartbeat)
      : inner_(std::move(inner)),
        tracker_(std::move(tracker)),
        seq_(seq),
        heartbeat_(std::move(heartbeat)) {}
  void wait(std::chrono::milliseconds timeout) override {
    // In slices of a second when a heartbeat is watched: waiting for peers is not a stall.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      try {
        inner_->wait(heartbeat_ ? std::min(left, std::chrono::milliseconds(1000)) : left);
        break;
      } catch (const TimeoutError& e) {
        // The collective's own failure (done, with its error), or this wait's end: report.
        if (!heartbeat_ || inner_->done() || std::chrono::steady_clock::now() >= deadline) {
          tracker_->timedOut(seq_, e);
        }
        heartbeat_->beat();
      }
    }
    tracker_->completed(seq_);
  }
  bool done() const override { return inner_->done(); }

 private:
  WorkPtr inner_;
  std::shared_ptr<Tracker> tracker_;
  int64_t seq_;
  std::shared_ptr<Heartbeat> heartbeat_;
};

class CheckedBackend final : public Backend {
 public:
  CheckedBackend(std::unique_ptr<Backend> inner, CheckOptions options)
      : inner_(std::move(inner)),
        options_(options),
        tracker_(
            std::make_shared<Tracker>(std::move(options), inner_->rank(), inner_->worldSize())) {}

  int rank() const override { return inner_->rank(); }
  int worldSize() const override { return inner_->worldSize(); }
  std::string name() const override { return inner_->name(); }
  std::string transport() const override { return inner_->transport(); }

  WorkPtr allreduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    return run({0, Op::kAllreduce, dtype, static_cast<int64_t>(count), static_cast<int64_t>(op)},
               [&] { return inner_->allreduce(data, count, dtype, op); });
  }
  WorkPtr reduceScatter(const void* input, void* output, size_t count, DType dtype,
                        ReduceOp op) override {
    return run(
        {0, Op::kReduceScatter, dtype, static_cast<int64_t>(count), static_cast<int64_t>(op)},
        [&] { return inner_->reduceScatter(input, output, count, dtype, op); });
  }
  WorkPtr allGather(const void* input, void* output, size_t count, DType dtype) override {
    return run({0, Op::kAllGather, dtype, static_cast<int64_t>(count), -1},
               [&] { return inner_->allGather(input, output, count, dtype); });
  }
  WorkPtr broadcast(void* data, size_t count, DType dtype, int root) override {
    return run({0, Op::kBroadcast, dtype, static_cast<int64_t>(count), root},
               [&] { return inner_->broadcast(data, count, dtype, root); });
  }
  WorkPtr barrier() override {
    return run({0, Op::kBarrier, DType::kUInt8, 0, -1}, [&] { return inner_->barrier(); });
  }
  std::unique_ptr<Backend> subgroup(const std::vector<int>& ranks,
                                    const std::string& partition) override {
    CheckOptions options = options_;
    options.prefix = options_.prefix + "/" + groupKey(ranks, partition);
    return std::make_unique<CheckedBackend>(inner_->subgroup(ranks, partition), options);
  }

 private:
  template <typename Issue>
  WorkPtr run(Call call, Issue&& issue) {
    call.seq = tracker_->record(call);
    if (options_.debug && worldSize() > 1) compare(call);
    return std::make_shared<CheckedWork>(issue(), tracker_, call.seq, options_.heartbeat);
  }

  // Debug mode: every rank's description of this call, compared before it runs.
  void compare(const Call& call) {
    const int64_t mine[4] = {static_cast<int64_t>(call.op), static_cast<int64_t>(call.dtype),
                             call.count, call.extra};
    std::vector<int64_t> all(4 * static_cast<size_t>(worldSize()));
    inner_->allGather(mine, all.data(), 4, DType::kInt64)->wait();
    std::string calls;
    bool differ = false;
    for (int r = 0; r < worldSize(); ++r) {
      const int64_t* theirs = all.data() + 4 * r;
      const Call c{call.seq, static_cast<Op>(theirs[0]), static_cast<DType>(theirs[1]), theirs[2],
                   theirs[3]};
      differ = differ || !c.sameAs(call);
      calls += "\n  rank " + std::to_string(r) + ": " + c.str();
    }
    if (differ) {
      throw CommunicationError("debug: the ranks called different collectives at #" +
                               std::to_string(call.seq) + " (" + inner_->name() + "):" + calls);
    }
  }

  std::unique_ptr<Backend> inner_;
  const CheckOptions options_;
  std::shared_ptr<Tracker> tracker_;
};

}  // namespace

std::unique_ptr<Backend> makeCheckedBackend(std::unique_ptr<Backend> inner, CheckOptions options) {
  return std::make_unique<CheckedBackend>(std::move(inner), std::move(options));
}

}  // namespace cxxlaunch::runtime
