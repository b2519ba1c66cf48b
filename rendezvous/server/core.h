#pragma once
// Core: the state of every run on the server, their parked calls, and the thread that acts on
// deadlines. The services (store_service.h, rendezvous_service.h) and RendezvousServer's own
// node (its join, keep-alive, restart and leave) all go through it, under one lock.

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "proto/rendezvous.pb.h"
#include "rendezvous/memory_store.h"
#include "rendezvous/run_state.h"
#include "rendezvous/server.h"
#include "rendezvous/server/parked_calls.h"
#include "rendezvous/wire.h"

namespace cxxlaunch::rendezvous::server {

using Clock = std::chrono::steady_clock;

class Core;

// A parked call of the callback API (the store's waits).
class ParkedReactor final : public grpc::ServerUnaryReactor, public ParkedCall {
 public:
  ParkedReactor(Core* core, std::string run_id) : core_(core), run_id_(std::move(run_id)) {}
  void answer(const grpc::Status& status) override { Finish(status); }
  void OnCancel() override;
  void OnDone() override { delete this; }

 private:
  Core* core_;
  const std::string run_id_;  // where it is parked: a cancel finds it in O(log)
};

// One run on the server: its rendezvous state, the store of its current round, its parked calls.
struct Run {
  Run(const std::string& id, const RunSettings& settings, MemoryBudget& budget)
      : state(id, settings), budget(budget) {}
  ~Run() { budget.adjust(-counted); }  // the store gives back its own
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;
  RunState state;
  MemoryBudget& budget;
  int64_t counted = 0;  // state.memoryBytes() as last counted in the budget
  int64_t store_round = -1;
  std::unique_ptr<MemoryStore> store;  // the key space of store_round
  ParkedCalls parked;
  // What parked calls have seen: they are re-checked only when something they wait for moved.
  uint64_t seen_epoch = 0;
  std::set<std::string> written_keys;   // since the last recheck
  SteadyTime last_call = Clock::now();  // for the retention of finished and abandoned runs
};

using Ready = std::vector<std::pair<ParkedCall*, grpc::Status>>;

inline void finishAll(Ready& ready) {
  for (auto& [call, status] : ready) call->answer(status);
  ready.clear();
}

// Throws InvalidArgument unless `id` is 1-128 letters, digits, '-', '_' or '.'.
void validateRunId(const std::string& id);

// A blocking call's wait: `requested_ms`, at most `cap`; a negative one is refused.
Millis waitTime(int64_t requested_ms, Millis cap);

// The state of every run, the parked calls, and the thread that acts on deadlines (the ticker).
// The ticker starts with gRPC (startTicker) or at the first call that waits: until then every
// call is the hosting node's own and answered at once, and nothing but that node's keep-alives
// has a deadline. (A single-node launcher whose workers never use the store starts none.)
class Core {
 public:
  explicit Core(const ServerOptions& options)
      : options_(options), budget_(options.max_total_bytes, "--store-max-total-bytes") {}

  ~Core() { stop(); }

  void stop();

  // Starts the ticker unless it runs (or the server stops). Throws std::system_error when no
  // thread can be started.
  void startTicker() {
    std::lock_guard<std::mutex> lock(mu_);
    ensureTicker();
  }

  grpc::Status authorize(const grpc::ServerContextBase& ctx) const;

  // Answers at once. `body` runs under the lock and may change the state of run `run_id`.
  template <typename Body>
  grpc::ServerUnaryReactor* answer(grpc::CallbackServerContext* ctx, const std::string& run_id,
                                   Body&& body) {
    auto* reactor = ctx->DefaultReactor();
    grpc::Status status = authorize(*ctx);
    Ready ready;
    bool wake = false;
    if (status.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      status = wire::guarded(body);
      const auto now = Clock::now();
      recheck(run_id, now, ready);
      touch(run_id, now);
      wake = tickerMustWake(run_id, std::nullopt);
    }
    if (wake) changed_.notify_all();
    reactor->Finish(status);
    finishAll(ready);
    return reactor;
  }

  // Answers when `attempt` can, or when `wait` has passed. `prepare` runs first, under the lock;
  // an error from it answers at once. `wait` is read after `prepare`, which may set it. `keys`:
  // what a store call waits for (its attempt is made again when one is written); none: a join,
  // whose attempt is made again when the round moves. Returns the status to answer with now, or
  // nullopt when the call was parked: `make_parked()` made its ParkedCall, answered later.
  template <typename Prepare, typename MakeParked>
  std::optional<grpc::Status> park(const grpc::ServerContextBase& ctx, const std::string& run_id,
                                   std::vector<std::string> keys, Prepare&& prepare,
                                   const Millis& wait, Attempt attempt, MakeParked&& make_parked) {
    grpc::Status status = authorize(ctx);
    Ready ready;
    std::optional<grpc::Status> result;
    bool parked = false;
    bool wake = false;
    if (status.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      status = stopping_ ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                        "the rendezvous server is shutting down")
                         : wire::guarded(prepare);
      const auto now = Clock::now();
      if (status.ok()) result = tryAttempt(attempt, false);
      std::optional<SteadyTime> deadline;
      if (status.ok() && !result) {
        ensureTicker();  // it answers the call when `wait` has passed
        deadline = now + wait;
        runs_.at(run_id)->parked.add(make_parked(),
                                     {*deadline, std::move(keys), std::move(attempt)});
        parked = true;
      }
      recheck(run_id, now, ready);
      touch(run_id, now);
      wake = tickerMustWake(run_id, deadline);
    }
    if (wake) changed_.notify_all();
    finishAll(ready);
    if (parked) return std::nullopt;
    return result ? *result : status;
  }

  // park() for the callback API: the reactor that answers, now or later.
  template <typename Prepare>
  grpc::ServerUnaryReactor* parkReactor(grpc::CallbackServerContext* ctx, const std::string& run_id,
                                        std::vector<std::string> keys, Prepare&& prepare,
                                        const Millis& wait, Attempt attempt) {
    ParkedReactor* parked = nullptr;
    auto now = park(*ctx, run_id, std::move(keys), prepare, wait, std::move(attempt),
                    [&] { return parked = new ParkedReactor(this, run_id); });
    if (!now) return parked;
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(*now);
    return reactor;
  }

  void cancelled(ParkedCall* parked, const std::string& run_id);

  // ---- the hosting process's own node (RendezvousServer::join and the others) -------------

  // The Join service's steps without RPC: register the node, then wait on a condition variable
  // (not a parked reactor) until its round is complete, the run ends, or the poll time passes.
  JoinPoll joinHere(const std::string& run_id, const NodeSpec& node, const RunSettings& settings,
                    Millis poll, const std::atomic<bool>& cancelled);

  // KeepAlive, RequestRestart, Leave without RPC: `body` changes the run under the lock, as the
  // service's handlers do.
  template <typename Body>
  Verdict callHere(const std::string& run_id, Body&& body) {
    Ready ready;
    bool wake = false;
    Verdict verdict;
    {
      std::lock_guard<std::mutex> lock(mu_);
      checkRunning();
      const auto now = Clock::now();
      verdict = body(runOf(run_id).state, now);
      recheck(run_id, now, ready);
      touch(run_id, now);
      wake = tickerMustWake(run_id, std::nullopt);
    }
    if (wake) changed_.notify_all();
    finishAll(ready);
    return verdict;
  }

  // A cancelled local join looks at its flag now.
  void wakeHere();

  // ---- helpers for handlers; call with the lock held -------------------------------------

  void checkRunning() const;

  Run& runOf(const std::string& run_id);

  // A node's join (the Join service's, and the hosting process's own): creates the run on its
  // first join. A node the run does not know yet is refused when what it adds would pass the
  // server's total, so that joins of new nodes and new runs cannot take the memory either.
  Run& join(const std::string& run_id, const NodeSpec& node, const RunSettings& settings,
            SteadyTime now);

  // A keep-alive's report of the node's workers: kept while the server's total has room for it,
  // else dropped (the keep-alive still counts; status shows the last report kept).
  void report(RunState& state, const std::string& node_id, std::vector<WorkerProgress> workers);

  // A restart request's failure as the run may keep it: once the server's total has no room for
  // its description, only the note that it was cut (the restart itself must go through).
  FailureReport failureToKeep(const FailureReport& failure) const;

  // The key space of a store call; throws StaleError when its round is not current. `writes`:
  // the keys the call sets, so that calls waiting for them look again.
  MemoryStore& storeOf(const rdzv::Scope& scope, const std::vector<std::string>& writes = {});

  const ServerOptions& options() const { return options_; }

  size_t runCount();

  int64_t heldBytes() const { return budget_.used(); }

  bool waitUntilSettled(const std::string& run_id, Millis timeout);

 private:
  static std::optional<grpc::Status> tryAttempt(const Attempt& attempt, bool expired);

  // Answers the parked calls of a run that can be answered: all of them when a round moved,
  // those waiting for a key written since, and those whose deadline has passed.
  void recheck(Run& run, SteadyTime now, Ready& ready);

  // Whether the ticker sleeps past a deadline of this run (or `extra`), or a waiter of
  // waitUntilSettled should look. The ticker is not woken otherwise: most calls only move
  // deadlines later.
  bool tickerMustWake(const std::string& run_id, std::optional<SteadyTime> extra);

  void recheck(const std::string& run_id, SteadyTime now, Ready& ready);

  // After a call of a run: it was active now, its state is counted again, and a run that became
  // final drops its store at once (its keys are what a flooding client would leave behind).
  void touch(const std::string& run_id, SteadyTime now);

  // Brings the budget up to date with the run's state (after the change: a call that adds to it
  // was admitted before, by join(), report() or failureToKeep()).
  void count(Run& run);

  // When a run may be freed: its retention after its last call, once it is final or has no live
  // node left (joins that never completed, nodes all evicted). nullopt: it is in use.
  std::optional<SteadyTime> expiry(const Run& run) const;

  // Frees the runs past their retention (lock held).
  void sweep(SteadyTime now);

  void tickLoop();
  void ensureTicker();  // lock held

  const ServerOptions options_;
  MemoryBudget budget_;  // before runs_: their stores give back to it when they go
  std::mutex mu_;
  std::condition_variable changed_;
  std::condition_variable here_;  // local joins (joinHere) wait on it: rounds moved, or stop
  std::map<std::string, std::unique_ptr<Run>> runs_;
  bool stopping_ = false;
  std::optional<SteadyTime> wake_at_;  // when the ticker plans to wake; nullopt: only if told
  std::thread ticker_;
};

}  // namespace cxxlaunch::rendezvous::server
