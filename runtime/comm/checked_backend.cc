#include "runtime/comm/checked_backend.h"

#include <algorithm>
#include <optional>
#include <sstream>
#include <vector>

#include "common/error.h"

namespace cxxlaunch::runtime {
namespace {

constexpr size_t kHistory = 16;

thread_local const char* current_api = nullptr;

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
  std::string api = CollectiveApi::current() ? CollectiveApi::current() : "";  // who issued it

  std::string str() const {
    std::ostringstream out;
    out << "#" << seq << " " << opName(op);
    if (op != Op::kBarrier) out << " " << dtypeName(dtype) << " x" << count;
    if (op == Op::kBroadcast) out << " from rank " << extra;
    if (!api.empty()) out << " (in " << api << ")";
    return out.str();
  }
  // As the store carries it: "seq op dtype count extra api".
  std::string encode() const {
    return std::to_string(seq) + " " + std::to_string(static_cast<int64_t>(op)) + " " +
           std::to_string(static_cast<int64_t>(dtype)) + " " + std::to_string(count) + " " +
           std::to_string(extra) + " " + api;
  }
  static std::optional<Call> decode(const std::string& text) {
    std::istringstream in(text);
    Call c;
    int64_t op = 0, dtype = 0;
    if (!(in >> c.seq >> op >> dtype >> c.count >> c.extra)) return std::nullopt;
    c.op = static_cast<Op>(op);
    c.dtype = static_cast<DType>(dtype);
    c.api.clear();
    in >> c.api;
    return c;
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

  // A wait past kCompareAfter: this rank's call in the store, and its peer's compared (the
  // header says why). Throws CommunicationError when they are in different calls.
  void compareWhileWaiting(int64_t seq) {
    if (!options_.store || world_ < 2) return;
    std::optional<Call> mine;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const Call& c : history_) {
        if (c.seq == seq) mine = c;
      }
    }
    if (!mine) return;
    const std::string key = options_.prefix + "/waiting/";
    const int peer = rank_ == 0 ? 1 : 0;
    std::optional<Call> theirs;
    try {
      options_.store->set(key + std::to_string(rank_), mine->encode());
      const std::string peer_key = key + std::to_string(peer);
      if (!options_.store->check({peer_key})) return;
      theirs = Call::decode(options_.store->get(peer_key, std::chrono::milliseconds(1000)));
    } catch (const std::exception&) {
      return;  // no store to compare through: the timeout's report still comes
    }
    if (!theirs || theirs->seq != seq || theirs->sameAs(*mine)) return;
    const Call& lower = rank_ < peer ? *mine : *theirs;
    const Call& higher = rank_ < peer ? *theirs : *mine;
    std::string message = "the ranks called different collectives at #" + std::to_string(seq) +
                          ":\n  rank " + std::to_string(std::min(rank_, peer)) + ": " +
                          lower.str() + "\n  rank " + std::to_string(std::max(rank_, peer)) + ": " +
                          higher.str();
    for (const std::string& api : {lower.api, higher.api}) {
      if (!api.empty() && message.find(api + " is a collective") == std::string::npos) {
        message += "\n" + api + " is a collective: every rank must call it, in the same order";
      }
    }
    throw CommunicationError(message);
  }

  // What a failed collective's error gains here: this rank's call, and for ranks in different
  // calls the public API that must be called on every rank.
  std::string context(int64_t seq, const std::string& error) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Call& c : history_) {
      if (c.seq != seq) continue;
      std::string out = "\n  this rank (" + std::to_string(rank_) + ") was in " + c.str();
      if (!c.api.empty() && error.find("called different collectives") != std::string::npos) {
        out += "\n" + c.api + " is a collective: every rank must call it, in the same order";
      }
      return out;
    }
    return "";
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

thread_local std::chrono::nanoseconds waited_on_this_thread{0};

class CheckedWork final : public Work {
 public:
  CheckedWork(WorkPtr inner, std::shared_ptr<Tracker> tracker, int64_t seq,
              std::shared_ptr<Heartbeat> heartbeat)
      : inner_(std::move(inner)),
        tracker_(std::move(tracker)),
        seq_(seq),
        heartbeat_(std::move(heartbeat)) {}
  void wait(std::chrono::milliseconds timeout) override {
    // In slices: the first of kCompareAfter, then of a second, after each of which the peers'
    // calls are compared (and the heartbeat beaten: waiting for peers is not a stall).
    const auto start = std::chrono::steady_clock::now(), deadline = start + timeout;
    struct CountWait {
      std::chrono::steady_clock::time_point start;
      ~CountWait() { waited_on_this_thread += std::chrono::steady_clock::now() - start; }
    } count{start};
    for (auto slice = kCompareAfter;; slice = std::chrono::milliseconds(1000)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      try {
        inner_->wait(
            std::min(left, heartbeat_ ? std::min(slice, std::chrono::milliseconds(1000)) : slice));
        break;
      } catch (const CommunicationError& e) {
        throw CommunicationError(e.what() + tracker_->context(seq_, e.what()));
      } catch (const TimeoutError& e) {
        // The collective's own failure (done, with its error), or this wait's end: report.
        if (inner_->done() || std::chrono::steady_clock::now() >= deadline) {
          tracker_->timedOut(seq_, e);
        }
        if (heartbeat_) heartbeat_->beat();
        if (std::chrono::steady_clock::now() - start >= kCompareAfter) {
          tracker_->compareWhileWaiting(seq_);
        }
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
  std::shared_ptr<void> sharedBuffer(size_t bytes) override { return inner_->sharedBuffer(bytes); }
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
      Call c{call.seq, static_cast<Op>(theirs[0]), static_cast<DType>(theirs[1]), theirs[2],
             theirs[3]};
      c.api.clear();  // not carried: this thread's would be wrong for the others
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

CollectiveApi::CollectiveApi(const char* api) : previous_(current_api) {
  if (current_api == nullptr) current_api = api;
}
CollectiveApi::~CollectiveApi() { current_api = previous_; }
const char* CollectiveApi::current() { return current_api; }

std::chrono::nanoseconds collectiveWaitOnThisThread() { return waited_on_this_thread; }

std::unique_ptr<Backend> makeCheckedBackend(std::unique_ptr<Backend> inner, CheckOptions options) {
  return std::make_unique<CheckedBackend>(std::move(inner), std::move(options));
}

}  // namespace cxxlaunch::runtime
