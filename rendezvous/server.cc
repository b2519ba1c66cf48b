#include "rendezvous/server.h"

#include <absl/synchronization/mutex.h>
#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_interceptor.h>
#include <sys/resource.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "common/host.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/memory_store.h"
#include "rendezvous/wire.h"

namespace cxxlaunch::rendezvous {
namespace {

using Clock = std::chrono::steady_clock;

class Core;

// A call that waits: answered later, from whichever thread sees its state change. `answer`
// sends the status (and the response the call's attempt filled in); the call frees itself once
// gRPC is done with it.
class ParkedCall {
 public:
  virtual ~ParkedCall() = default;
  virtual void answer(const grpc::Status& status) = 0;
};

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

// Returns the call's status once it can be answered; `expired`: its deadline has passed.
using Attempt = std::function<std::optional<grpc::Status>(bool expired)>;

struct Parked {
  SteadyTime deadline;
  std::vector<std::string> keys;  // a store call waits for these; a join (none) for its round
  Attempt attempt;
};

// The parked calls of a run, indexed so that a call costs O(log P) however many are parked: a
// call looks only at those it may have made answerable. Every parked call is looked at when the
// run's round moves (an epoch: O(rounds) times a run); a store write looks at the calls waiting
// for the keys it wrote; the deadline thread, and every call, at the calls whose deadline passed.
class ParkedCalls {
 public:
  bool empty() const { return calls_.empty(); }
  std::optional<SteadyTime> earliestDeadline() const {
    if (by_deadline_.empty()) return std::nullopt;
    return by_deadline_.begin()->first;
  }

  void add(ParkedCall* parked, Parked call) {
    by_deadline_.emplace(call.deadline, parked);
    for (const auto& key : call.keys) by_key_[key].insert(parked);
    calls_.emplace(parked, std::move(call));
  }

  // The call of `parked`, taken out; nullopt when it is not parked here.
  std::optional<Parked> take(ParkedCall* parked) {
    auto it = calls_.find(parked);
    if (it == calls_.end()) return std::nullopt;
    Parked call = std::move(it->second);
    calls_.erase(it);
    by_deadline_.erase({call.deadline, parked});
    for (const auto& key : call.keys) {
      auto waiting = by_key_.find(key);
      if (waiting == by_key_.end()) continue;  // a key named twice, gone with the first
      waiting->second.erase(parked);
      if (waiting->second.empty()) by_key_.erase(waiting);
    }
    return call;
  }

  const Parked& at(ParkedCall* parked) const { return calls_.at(parked); }

  std::vector<ParkedCall*> all() const {
    std::vector<ParkedCall*> out;
    out.reserve(calls_.size());
    for (const auto& [parked, call] : calls_) out.push_back(parked);
    return out;
  }

  // Those whose deadline is at or before `now`.
  void addExpired(SteadyTime now, std::vector<ParkedCall*>& out) const {
    for (auto it = by_deadline_.begin(); it != by_deadline_.end() && it->first <= now; ++it) {
      out.push_back(it->second);
    }
  }

  // Those waiting for one of `keys` (each once).
  void addWaitingFor(const std::set<std::string>& keys, std::vector<ParkedCall*>& out) const {
    for (const auto& key : keys) {
      if (auto it = by_key_.find(key); it != by_key_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
      }
    }
  }

 private:
  std::unordered_map<ParkedCall*, Parked> calls_;
  std::set<std::pair<SteadyTime, ParkedCall*>> by_deadline_;
  std::unordered_map<std::string, std::unordered_set<ParkedCall*>> by_key_;
};

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

void finishAll(Ready& ready) {
  for (auto& [call, status] : ready) call->answer(status);
  ready.clear();
}

void validateRunId(const std::string& id) {
  const bool ok =
      !id.empty() && id.size() <= 128 && std::all_of(id.begin(), id.end(), [](unsigned char c) {
        return std::isalnum(c) || c == '-' || c == '_' || c == '.';
      });
  if (!ok) throw InvalidArgument("run id must have 1-128 letters, digits, '-', '_' or '.'");
}

Millis waitTime(int64_t requested_ms, Millis cap) {
  if (requested_ms < 0) throw InvalidArgument("timeout must be >= 0 ms");
  return std::min(Millis(requested_ms), cap);
}

// The state of every run, the parked calls, and the thread that acts on deadlines.
class Core {
 public:
  explicit Core(const ServerOptions& options)
      : options_(options), budget_(options.max_total_bytes, "--store-max-total-bytes") {
    ticker_ = std::thread([this] { tickLoop(); });
  }

  ~Core() { stop(); }

  void stop() {
    Ready ready;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      stopping_ = true;
      for (auto& [id, run] : runs_) {
        for (ParkedCall* parked : run->parked.all()) {
          run->parked.take(parked);
          ready.emplace_back(parked, grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                                  "the rendezvous server is shutting down"));
        }
      }
    }
    changed_.notify_all();
    here_.notify_all();
    finishAll(ready);
    if (ticker_.joinable()) ticker_.join();
  }

  grpc::Status authorize(const grpc::ServerContextBase& ctx) const {
    if (options_.token.empty()) return grpc::Status::OK;
    const auto& metadata = ctx.client_metadata();
    auto it = metadata.find(wire::kTokenHeader);
    bool ok = it != metadata.end() && it->second.size() == options_.token.size();
    if (ok) {
      unsigned char diff = 0;  // constant time: no early exit on the first wrong byte
      for (size_t i = 0; i < options_.token.size(); ++i) {
        diff |= static_cast<unsigned char>(it->second.data()[i] ^ options_.token[i]);
      }
      ok = diff == 0;
    }
    if (ok) return grpc::Status::OK;
    return {grpc::StatusCode::UNAUTHENTICATED,
            "missing or wrong job token: give the job's token (--rdzv_conf token_file=FILE or "
            "CXXLAUNCH_TOKEN)"};
  }

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

  void cancelled(ParkedCall* parked, const std::string& run_id) {
    bool found = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // A run with a parked call is not freed, so a parked call's run is there.
      if (auto it = runs_.find(run_id); it != runs_.end()) {
        found = it->second->parked.take(parked).has_value();
      }
    }
    // Not found: it was answered already and is on its way out.
    if (found) parked->answer(grpc::Status::CANCELLED);
  }

  // ---- the hosting process's own node (RendezvousServer::join and the others) -------------

  // The Join service's steps without RPC: register the node, then wait on a condition variable
  // (not a parked reactor) until its round is complete, the run ends, or the poll time passes.
  JoinPoll joinHere(const std::string& run_id, const NodeSpec& node, const RunSettings& settings,
                    Millis poll, const std::atomic<bool>& cancelled) {
    Ready ready;
    bool wake = false;
    SteadyTime deadline;
    {
      std::lock_guard<std::mutex> lock(mu_);
      checkRunning();
      const auto now = Clock::now();
      const RunSettings& s = join(run_id, node, settings, now).state.settings();
      deadline = now + std::min({waitTime(poll.count(), options_.max_wait), s.keep_alive_interval,
                                 s.evictionTimeout() / 2});
      recheck(run_id, now, ready);
      touch(run_id, now);
      wake = tickerMustWake(run_id, std::nullopt);
    }
    if (wake) changed_.notify_all();
    finishAll(ready);  // other nodes' joins that this one completed
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      checkRunning();
      if (cancelled) throw CommunicationError("the join was cancelled");
      Run& run = runOf(run_id);
      if (auto placement = run.state.placementOf(node.id)) return {placement, ""};
      run.state.checkNotFinal();
      if (Clock::now() >= deadline) return {std::nullopt, run.state.waitingFor()};
      here_.wait_until(lock, deadline);
    }
  }

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
  void wakeHere() {
    { std::lock_guard<std::mutex> lock(mu_); }
    here_.notify_all();
  }

  // ---- helpers for handlers; call with the lock held -------------------------------------

  void checkRunning() const {
    if (stopping_) throw CommunicationError("the rendezvous server is shutting down");
  }

  Run& runOf(const std::string& run_id) {
    validateRunId(run_id);
    auto it = runs_.find(run_id);
    if (it == runs_.end()) {
      throw StaleError("no run '" + run_id +
                       "' on this server: its nodes have not joined yet, or it ended more than "
                       "the server's run retention ago");
    }
    return *it->second;
  }

  // A node's join (the Join service's, and the hosting process's own): creates the run on its
  // first join. A node the run does not know yet is refused when what it adds would pass the
  // server's total, so that joins of new nodes and new runs cannot take the memory either.
  Run& join(const std::string& run_id, const NodeSpec& node, const RunSettings& settings,
            SteadyTime now) {
    validateRunId(run_id);
    node.validate();  // before the run exists: a bad first join must create nothing
    settings.validate();
    auto it = runs_.find(run_id);
    if (it == runs_.end() || !it->second->state.knows(node.id)) {
      const int64_t adds = RunState::kJoinBytes + (it == runs_.end() ? RunState::kRunBytes : 0);
      if (!budget_.fits(adds)) budget_.refuse("the join of node " + node.id + " to run " + run_id);
    }
    if (it == runs_.end()) {
      it = runs_.emplace(run_id, std::make_unique<Run>(run_id, settings, budget_)).first;
    }
    it->second->state.join(node, settings, now);
    return *it->second;
  }

  // A keep-alive's report of the node's workers: kept while the server's total has room for it,
  // else dropped (the keep-alive still counts; status shows the last report kept).
  void report(RunState& state, const std::string& node_id, std::vector<WorkerProgress> workers) {
    if (workers.empty()) return;
    if (!budget_.fits(static_cast<int64_t>(workers.size()) * RunState::kWorkerBytes)) return;
    state.reportWorkers(node_id, std::move(workers));
  }

  // A restart request's failure as the run may keep it: once the server's total has no room for
  // its description, only the note that it was cut (the restart itself must go through).
  FailureReport failureToKeep(const FailureReport& failure) const {
    const auto size =
        static_cast<int64_t>(std::min(failure.description.size(), kMaxFailureDescriptionBytes));
    if (budget_.fits(2 * size)) return failure;  // kept twice: the root cause and the reason
    FailureReport kept = failure;
    kept.description = truncateDescription(failure.description, 0);
    return kept;
  }

  // The key space of a store call; throws StaleError when its round is not current. `writes`:
  // the keys the call sets, so that calls waiting for them look again.
  MemoryStore& storeOf(const rdzv::Scope& scope, const std::vector<std::string>& writes = {}) {
    Run& run = runOf(scope.run_id());
    run.written_keys.insert(writes.begin(), writes.end());
    run.state.checkStoreRound(scope.round());
    if (run.store_round != scope.round()) {
      // The old round's keys go with it.
      run.store = std::make_unique<MemoryStore>(options_.store_limits, &budget_);
      run.store_round = scope.round();
    }
    return *run.store;
  }

  const ServerOptions& options() const { return options_; }

  size_t runCount() {
    std::lock_guard<std::mutex> lock(mu_);
    return runs_.size();
  }

  int64_t heldBytes() const { return budget_.used(); }

  bool waitUntilSettled(const std::string& run_id, Millis timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, timeout, [&] {
      auto it = runs_.find(run_id);
      return stopping_ || (it != runs_.end() && it->second->state.everyoneInformed());
    });
  }

 private:
  static std::optional<grpc::Status> tryAttempt(const Attempt& attempt, bool expired) {
    std::optional<grpc::Status> result;
    grpc::Status error = wire::guarded([&] {
      result = attempt(expired);
      return grpc::Status::OK;
    });
    if (!error.ok()) return error;
    return result;
  }

  // Answers the parked calls of a run that can be answered: all of them when a round moved,
  // those waiting for a key written since, and those whose deadline has passed.
  void recheck(Run& run, SteadyTime now, Ready& ready) {
    const bool moved = run.state.epoch() != run.seen_epoch;
    run.seen_epoch = run.state.epoch();
    if (moved) here_.notify_all();  // a local join of this run may be answered now
    std::vector<ParkedCall*> candidates;
    if (moved) {
      candidates = run.parked.all();
    } else {
      run.parked.addWaitingFor(run.written_keys, candidates);
      run.parked.addExpired(now, candidates);
      std::sort(candidates.begin(), candidates.end());
      candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
    }
    run.written_keys.clear();
    for (ParkedCall* parked : candidates) {
      const Parked& call = run.parked.at(parked);
      if (auto result = tryAttempt(call.attempt, now >= call.deadline)) {
        ready.emplace_back(parked, *result);
        run.parked.take(parked);
      }
    }
  }

  // Whether the ticker sleeps past a deadline of this run (or `extra`), or a waiter of
  // waitUntilSettled should look. The ticker is not woken otherwise: most calls only move
  // deadlines later.
  bool tickerMustWake(const std::string& run_id, std::optional<SteadyTime> extra) {
    auto it = runs_.find(run_id);
    if (it == runs_.end()) return false;
    if (it->second->state.finalState()) return true;
    std::optional<SteadyTime> deadline = it->second->state.nextDeadline();
    if (extra && (!deadline || *extra < *deadline)) deadline = extra;
    if (auto at = expiry(*it->second); at && (!deadline || *at < *deadline)) deadline = at;
    return deadline && (!wake_at_ || *deadline < *wake_at_);
  }

  void recheck(const std::string& run_id, SteadyTime now, Ready& ready) {
    auto it = runs_.find(run_id);
    if (it != runs_.end()) recheck(*it->second, now, ready);
  }

  // After a call of a run: it was active now, its state is counted again, and a run that became
  // final drops its store at once (its keys are what a flooding client would leave behind).
  void touch(const std::string& run_id, SteadyTime now) {
    auto it = runs_.find(run_id);
    if (it == runs_.end()) return;
    Run& run = *it->second;
    run.last_call = now;
    count(run);
    if (run.state.finalState() && run.store) {
      run.store.reset();
      run.store_round = -1;
    }
  }

  // Brings the budget up to date with the run's state (after the change: a call that adds to it
  // was admitted before, by join(), report() or failureToKeep()).
  void count(Run& run) {
    const int64_t now = run.state.memoryBytes();
    budget_.adjust(now - run.counted);
    run.counted = now;
  }

  // When a run may be freed: its retention after its last call, once it is final or has no live
  // node left (joins that never completed, nodes all evicted). nullopt: it is in use.
  std::optional<SteadyTime> expiry(const Run& run) const {
    if (!run.parked.empty() || run.state.hasLiveNodes()) return std::nullopt;
    return run.last_call + options_.run_retention;
  }

  // Frees the runs past their retention (lock held).
  void sweep(SteadyTime now) {
    for (auto it = runs_.begin(); it != runs_.end();) {
      auto at = expiry(*it->second);
      if (at && now >= *at) {
        it = runs_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void tickLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      const auto now = Clock::now();
      Ready ready;
      for (auto& [id, run] : runs_) {
        run->state.tick(now);
        count(*run);
        recheck(*run, now, ready);
      }
      sweep(now);
      std::optional<SteadyTime> next;
      for (auto& [id, run] : runs_) {
        auto deadline = run->state.nextDeadline();
        if (auto parked = run->parked.earliestDeadline();
            parked && (!deadline || *parked < *deadline)) {
          deadline = parked;
        }
        if (auto at = expiry(*run); at && (!deadline || *at < *deadline)) deadline = at;
        if (deadline && (!next || *deadline < *next)) next = deadline;
      }
      if (!ready.empty()) {
        lock.unlock();
        changed_.notify_all();
        finishAll(ready);
        lock.lock();
        continue;
      }
      wake_at_ = next;
      if (next) {
        changed_.wait_until(lock, *next);
      } else {
        changed_.wait(lock);
      }
    }
  }

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

void ParkedReactor::OnCancel() { core_->cancelled(this, run_id_); }

std::string describeMissing(const std::vector<std::string>& keys, MemoryStore& store, Millis wait) {
  for (const auto& key : keys) {
    if (!store.check({key})) {
      return "key '" + key + "' did not appear within " + std::to_string(wait.count()) + " ms";
    }
  }
  return "timed out";
}

class StoreService final : public rdzv::Store::CallbackService {
 public:
  explicit StoreService(Core& core) : core_(core) {}

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* ctx, const rdzv::SetRequest* req,
                                rdzv::SetResponse*) override {
    return core_.answer(ctx, req->scope().run_id(), [&] {
      core_.storeOf(req->scope(), {req->key()}).set(req->key(), req->value());
      return grpc::Status::OK;
    });
  }

  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const rdzv::GetRequest* req,
                                rdzv::GetResponse* resp) override {
    const Millis wait = safeWait(req->timeout_ms());
    return core_.parkReactor(
        ctx, req->scope().run_id(), {req->key()},
        [&] { return prepare(req->scope(), req->timeout_ms()); }, wait,
        [this, req, resp, wait](bool expired) -> std::optional<grpc::Status> {
          MemoryStore& store = core_.storeOf(req->scope());
          if (store.check({req->key()})) {
            resp->set_value(store.get(req->key(), Millis(0)));
            return grpc::Status::OK;
          }
          if (expired) {
            return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                describeMissing({req->key()}, store, wait));
          }
          return std::nullopt;
        });
  }

  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* ctx, const rdzv::AddRequest* req,
                                rdzv::AddResponse* resp) override {
    return core_.answer(ctx, req->scope().run_id(), [&] {
      resp->set_value(core_.storeOf(req->scope(), {req->key()}).add(req->key(), req->delta()));
      return grpc::Status::OK;
    });
  }

  grpc::ServerUnaryReactor* CompareSet(grpc::CallbackServerContext* ctx,
                                       const rdzv::CompareSetRequest* req,
                                       rdzv::CompareSetResponse* resp) override {
    return core_.answer(ctx, req->scope().run_id(), [&] {
      resp->set_value(core_.storeOf(req->scope(), {req->key()})
                          .compareSet(req->key(), req->expected(), req->desired()));
      return grpc::Status::OK;
    });
  }

  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx, const rdzv::KeysRequest* req,
                                 rdzv::WaitResponse*) override {
    return waitForKeys(ctx, req, [](MemoryStore&) {});
  }

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* ctx, const rdzv::KeysRequest* req,
                                  rdzv::CheckResponse* resp) override {
    return core_.answer(ctx, req->scope().run_id(), [&] {
      resp->set_ready(core_.storeOf(req->scope()).check(keysOf(*req)));
      return grpc::Status::OK;
    });
  }

  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx, const rdzv::DeleteRequest* req,
                                   rdzv::DeleteResponse* resp) override {
    return core_.answer(ctx, req->scope().run_id(), [&] {
      resp->set_existed(core_.storeOf(req->scope()).deleteKey(req->key()));
      return grpc::Status::OK;
    });
  }

  grpc::ServerUnaryReactor* NumKeys(grpc::CallbackServerContext* ctx,
                                    const rdzv::NumKeysRequest* req,
                                    rdzv::NumKeysResponse* resp) override {
    return core_.answer(ctx, req->scope().run_id(), [&] {
      resp->set_count(core_.storeOf(req->scope()).numKeys());
      return grpc::Status::OK;
    });
  }

  grpc::ServerUnaryReactor* MultiGet(grpc::CallbackServerContext* ctx, const rdzv::KeysRequest* req,
                                     rdzv::MultiGetResponse* resp) override {
    const int64_t max_bytes = core_.options().max_message_bytes;
    return waitForKeys(ctx, req, [req, resp, max_bytes](MemoryStore& store) {
      resp->clear_values();
      for (const auto& value : store.multiGet(keysOf(*req), Millis(0))) resp->add_values(value);
      // gRPC would refuse to send it with a message about itself; say what to do instead.
      if (static_cast<int64_t>(resp->ByteSizeLong()) > max_bytes) {
        const auto size = resp->ByteSizeLong();
        resp->clear_values();
        throw LimitExceeded("multi_get: the answer would be " + std::to_string(size) +
                            " bytes, more than the message limit of " + std::to_string(max_bytes) +
                            " (cxxlaunchd --max-message-bytes); get fewer keys at a time");
      }
    });
  }

  grpc::ServerUnaryReactor* MultiSet(grpc::CallbackServerContext* ctx,
                                     const rdzv::MultiSetRequest* req,
                                     rdzv::MultiSetResponse*) override {
    return core_.answer(ctx, req->scope().run_id(), [&] {
      std::vector<std::string> values(req->values().begin(), req->values().end());
      const auto keys = keysOf(*req);
      core_.storeOf(req->scope(), keys).multiSet(keys, values);
      return grpc::Status::OK;
    });
  }

 private:
  template <typename Request>
  static std::vector<std::string> keysOf(const Request& req) {
    return {req.keys().begin(), req.keys().end()};
  }

  Millis safeWait(int64_t timeout_ms) const {
    return timeout_ms < 0 ? Millis(0) : std::min(Millis(timeout_ms), core_.options().max_wait);
  }

  grpc::Status prepare(const rdzv::Scope& scope, int64_t timeout_ms) {
    waitTime(timeout_ms, core_.options().max_wait);  // rejects negative timeouts
    core_.storeOf(scope);
    return grpc::Status::OK;
  }

  template <typename Fill>
  grpc::ServerUnaryReactor* waitForKeys(grpc::CallbackServerContext* ctx,
                                        const rdzv::KeysRequest* req, Fill fill) {
    const Millis wait = safeWait(req->timeout_ms());
    return core_.parkReactor(
        ctx, req->scope().run_id(), keysOf(*req),
        [&] { return prepare(req->scope(), req->timeout_ms()); }, wait,
        [this, req, wait, fill](bool expired) -> std::optional<grpc::Status> {
          MemoryStore& store = core_.storeOf(req->scope());
          const auto keys = keysOf(*req);
          if (store.check(keys)) {
            fill(store);
            return grpc::Status::OK;
          }
          if (expired) {
            return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                describeMissing(keys, store, wait));
          }
          return std::nullopt;
        });
  }

  Core& core_;
};

// The Join service's steps:
// 1. Register the node (RunState::join) and refresh its keep-alive.
// 2. If its round is complete, answer with its placement at once.
// 3. Else park the call until the round completes, the run ends, or the poll time passes
//    (capped below the eviction timeout, so a waiting node never looks silent).
// Returns the status to answer with now (and `resp` filled in), or nullopt when parked: the
// ParkedCall `make_parked()` gave is answered later.
template <typename MakeParked>
std::optional<grpc::Status> serveJoin(Core& core, const grpc::ServerContextBase& ctx,
                                      const rdzv::JoinRequest& req, rdzv::JoinResponse& resp,
                                      MakeParked&& make_parked) {
  const RunSettings settings = wire::fromProto(req.settings());
  const NodeSpec node = wire::fromProto(req.node());
  Millis wait{0};
  auto prepare = [&] {
    const RunSettings& s = core.join(req.run_id(), node, settings, Clock::now()).state.settings();
    wait = std::min({waitTime(req.poll_ms(), core.options().max_wait), s.keep_alive_interval,
                     s.evictionTimeout() / 2});
    return grpc::Status::OK;
  };
  const std::string& run_id = req.run_id();
  return core.park(
      ctx, run_id, /*keys=*/{}, prepare, wait,
      [&core, run_id, id = node.id, out = &resp](bool expired) -> std::optional<grpc::Status> {
        Run& run = core.runOf(run_id);
        if (auto placement = run.state.placementOf(id)) {
          out->set_complete(true);
          wire::toProto(*placement, out->mutable_round());
          return grpc::Status::OK;
        }
        run.state.checkNotFinal();
        if (expired) {
          out->set_complete(false);
          out->set_waiting_for(run.state.waitingFor());
          return grpc::Status::OK;
        }
        return std::nullopt;
      },
      make_parked);
}

std::string undecodableMessage(const std::string& method) {
  return "the request to " + method +
         " is not a valid message of proto/rendezvous.proto (client and server of different "
         "versions?)";
}

// Join runs on gRPC's completion-queue API, the other calls on its callback API. At N waiting
// nodes the callback API keeps N completion-queue tags outstanding, one per open call, and
// Debian's gRPC (built without NDEBUG) scans all of them at every completion: O(N) per call. A
// join parked here holds no tag until it is answered, and its events are handled on one thread
// of ours rather than handed to gRPC's callback threads. Join is a raw method (bytes in, bytes
// out) so that an undecodable request is answered with INVALID_ARGUMENT, as the proto promises.
using RendezvousBase = rdzv::Rendezvous::WithCallbackMethod_KeepAlive<
    rdzv::Rendezvous::WithCallbackMethod_RequestRestart<
        rdzv::Rendezvous::WithCallbackMethod_Leave<rdzv::Rendezvous::WithCallbackMethod_Status<
            rdzv::Rendezvous::WithRawMethod_Join<rdzv::Rendezvous::Service>>>>>;

// The joins' completion queue and the thread that serves it. Calls are requested, and answered
// at once, on that thread. A parked join is answered by whichever thread moves its round, and
// Core::stop answers those left before the queue closes.
class Joins {
 public:
  // Its thread starts here, before anything of gRPC: in a process that may start no more
  // threads this fails at once, where gRPC, once initialised, would hang in its shutdown
  // waiting for threads it could not start.
  Joins(Core& core, RendezvousBase& service)
      : core_(core), service_(service), thread_([this] { serve(); }) {}
  ~Joins() { close(); }
  Joins(const Joins&) = delete;
  Joins& operator=(const Joins&) = delete;

  void addTo(grpc::ServerBuilder& builder) { queue_ = builder.AddCompletionQueue(); }
  // Once the server has started: the thread takes calls from here on.
  void accept() {
    ready_.set_value(queue_.get());
    accepting_ = true;
  }
  // After the server's shutdown: the thread closes the queue, drains it and ends.
  void close();

  Core& core() { return core_; }
  RendezvousBase& service() { return service_; }
  grpc::ServerCompletionQueue* queue() { return queue_.get(); }
  bool closing() const { return closing_; }  // on the queue's thread only

 private:
  void serve();

  Core& core_;
  RendezvousBase& service_;
  std::unique_ptr<grpc::ServerCompletionQueue> queue_;
  // The queue once the server has started, or nullptr: it never will. Every JoinCall is made,
  // served and freed on the thread, so that what gRPC hands between threads stays on one.
  std::promise<grpc::ServerCompletionQueue*> ready_;
  bool accepting_ = false;
  std::unique_ptr<grpc::Alarm> close_alarm_;  // made by close(): no gRPC object before the thread
  bool closing_ = false;
  std::thread thread_;  // last: it starts once the rest is made
};

// One Join: requested, then served, then answered (at once or when its round moves).
class JoinCall final : public ParkedCall {
 public:
  explicit JoinCall(Joins& joins) : joins_(joins) {
    joins.service().RequestJoin(&ctx_, &request_, &writer_, joins.queue(), joins.queue(), this);
  }

  // The queue's event for this call: a request arrived (ok), the answer went out, or the
  // server is shutting down (!ok).
  void proceed(bool ok) {
    if (answered_ || !ok || joins_.closing()) {
      // An answer given on another thread is complete before its event comes; gRPC's own
      // ordering is invisible to ThreadSanitizer, this lock is not.
      { std::lock_guard<std::mutex> lock(answering_); }
      delete this;
      return;
    }
    new JoinCall(joins_);  // the next request's slot
    rdzv::JoinRequest req;
    if (!grpc::SerializationTraits<rdzv::JoinRequest>::Deserialize(&request_, &req).ok()) {
      answer({grpc::StatusCode::INVALID_ARGUMENT,
              undecodableMessage("/cxxlaunch.rdzv.Rendezvous/Join")});
      return;
    }
    request_.Clear();  // a parked join keeps only what it answers with
    std::optional<grpc::Status> now;
    const grpc::Status error = wire::guarded([&] {
      now = serveJoin(joins_.core(), ctx_, req, response_, [this] { return this; });
      return grpc::Status::OK;
    });
    if (!error.ok()) {
      answer(error);
    } else if (now) {
      answer(*now);
    }
  }

  void answer(const grpc::Status& status) override {
    std::lock_guard<std::mutex> lock(answering_);
    answered_ = true;
    if (!status.ok()) {
      writer_.FinishWithError(status, this);
      return;
    }
    bool own = false;
    const grpc::Status encoded =
        grpc::SerializationTraits<rdzv::JoinResponse>::Serialize(response_, &reply_, &own);
    if (encoded.ok()) {
      writer_.Finish(reply_, status, this);
    } else {
      writer_.FinishWithError(encoded, this);
    }
  }

 private:
  Joins& joins_;
  grpc::ServerContext ctx_;
  grpc::ByteBuffer request_;
  grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> writer_{&ctx_};
  rdzv::JoinResponse response_;
  grpc::ByteBuffer reply_;
  std::mutex answering_;
  std::atomic<bool> answered_ = false;  // set by whichever thread answers
};

void Joins::serve() {
  grpc::ServerCompletionQueue* queue = ready_.get_future().get();
  if (queue == nullptr) return;
  // Requests taken ahead, so that a burst of joins does not wait for a slot.
  for (int i = 0; i < 64; ++i) new JoinCall(*this);
  void* tag = nullptr;
  bool ok = false;
  while (queue->Next(&tag, &ok)) {
    if (tag == &close_alarm_) {
      closing_ = true;
      queue->Shutdown();
      continue;
    }
    static_cast<JoinCall*>(tag)->proceed(ok);
  }
}

void Joins::close() {
  if (!thread_.joinable()) return;
  if (accepting_) {
    close_alarm_ = std::make_unique<grpc::Alarm>();
    close_alarm_->Set(queue_.get(), gpr_now(GPR_CLOCK_MONOTONIC), &close_alarm_);
    thread_.join();
    return;
  }
  ready_.set_value(nullptr);  // the server did not start: nothing was asked of the queue
  thread_.join();
  if (queue_) {
    queue_->Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (queue_->Next(&tag, &ok)) {
    }
  }
}

class RendezvousService final : public RendezvousBase {
 public:
  explicit RendezvousService(Core& core) : core_(core) {}

  grpc::ServerUnaryReactor* KeepAlive(grpc::CallbackServerContext* ctx,
                                      const rdzv::KeepAliveRequest* req,
                                      rdzv::KeepAliveResponse* resp) override {
    return core_.answer(ctx, req->run_id(), [&] {
      Run& run = core_.runOf(req->run_id());
      std::vector<WorkerProgress> workers;
      workers.reserve(static_cast<size_t>(req->workers_size()));
      for (const auto& w : req->workers()) workers.push_back(wire::fromProto(w));
      core_.report(run.state, req->node_id(), std::move(workers));
      wire::toProto(run.state.keepAlive(req->node_id(), req->round(), Clock::now()), resp);
      return grpc::Status::OK;
    });
  }

  grpc::ServerUnaryReactor* RequestRestart(grpc::CallbackServerContext* ctx,
                                           const rdzv::RestartRequest* req,
                                           rdzv::KeepAliveResponse* resp) override {
    return core_.answer(ctx, req->run_id(), [&] {
      Run& run = core_.runOf(req->run_id());
      wire::toProto(run.state.requestRestart(req->node_id(), req->round(),
                                             core_.failureToKeep(wire::fromProto(req->failure())),
                                             Clock::now()),
                    resp);
      return grpc::Status::OK;
    });
  }

  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const rdzv::LeaveRequest* req,
                                  rdzv::KeepAliveResponse* resp) override {
    return core_.answer(ctx, req->run_id(), [&] {
      Run& run = core_.runOf(req->run_id());
      wire::toProto(run.state.leave(req->node_id(), req->round(), Clock::now()), resp);
      return grpc::Status::OK;
    });
  }

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx, const rdzv::StatusRequest* req,
                                   rdzv::StatusResponse* resp) override {
    return core_.answer(ctx, req->run_id(), [&] {
      Run& run = core_.runOf(req->run_id());
      wire::toProto(run.state.status(Clock::now()), resp);
      return grpc::Status::OK;
    });
  }

 private:
  Core& core_;
};

// gRPC answers a request it cannot decode with UNIMPLEMENTED and no message; the proto promises
// INVALID_ARGUMENT, and a client deserves to hear what was wrong. The interceptor sees the
// failed decoding (no message after POST_RECV_MESSAGE) and rewrites the status it sends.
class UndecodableRequest final : public grpc::experimental::Interceptor {
 public:
  explicit UndecodableRequest(grpc::experimental::ServerRpcInfo* info) : method_(info->method()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using Hook = grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(Hook::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      undecodable_ = true;
    }
    if (undecodable_ && methods->QueryInterceptionHookPoint(Hook::PRE_SEND_STATUS)) {
      methods->ModifySendStatus({grpc::StatusCode::INVALID_ARGUMENT, undecodableMessage(method_)});
    }
    methods->Proceed();
  }

 private:
  const char* method_;
  bool undecodable_ = false;
};

class UndecodableRequestFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new UndecodableRequest(info);
  }
};

}  // namespace

struct RendezvousServer::Impl {
  explicit Impl(const ServerOptions& options)
      : options(options), core(options), store(core), rendezvous(core), joins(core, rendezvous) {}
  ServerOptions options;
  Core core;
  StoreService store;
  RendezvousService rendezvous;
  Joins joins;  // after the server in shutdown, destroyed after it
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

RendezvousServer::RendezvousServer(const ServerOptions& options)
    : impl_(std::make_unique<Impl>(options)) {
  wire::quietGrpcLogs();
  // Debian builds abseil without NDEBUG, so every lock of gRPC's mutexes also ran its deadlock
  // detector, whose graph lookups grow with the mutexes alive: one set per open call, 5.5% of
  // the daemon's time at 65,536 waiting joins (perf). A diagnostic, off as in release builds.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({wire::readTlsFile(options.tls_key_file, "key"),
                                      wire::readTlsFile(options.tls_cert_file, "certificate")});
    if (!options.tls_ca_file.empty()) {
      ssl.pem_root_certs = wire::readTlsFile(options.tls_ca_file, "CA");
      ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
    credentials = grpc::SslServerCredentials(ssl);
  } else {
    credentials = grpc::InsecureServerCredentials();
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(formatHostPort(options.host, options.port), credentials, &impl_->port);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // a taken port must fail, not share
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<UndecodableRequestFactory>());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.RegisterService(&impl_->store);
  builder.RegisterService(&impl_->rendezvous);
  impl_->joins.addTo(builder);
  impl_->server = builder.BuildAndStart();
  if (!impl_->server || impl_->port == 0) {
    impl_->core.stop();
    // gRPC says only that it failed (and has closed what it opened by now): a process whose
    // descriptors are nearly all in use (a server needs a dozen or so) is told apart from a port.
    rlimit limit{};
    std::error_code ec;
    const auto open = std::distance(std::filesystem::directory_iterator("/proc/self/fd", ec),
                                    std::filesystem::directory_iterator());
    if (!ec && ::getrlimit(RLIMIT_NOFILE, &limit) == 0 &&
        open + 32 > static_cast<long>(limit.rlim_cur)) {
      throw SystemError("listening on " + formatHostPort(options.host, options.port), EMFILE);
    }
    throw CommunicationError("cannot listen on " + formatHostPort(options.host, options.port) +
                             ": the port is taken or the address is not on this machine");
  }
  impl_->joins.accept();
}

RendezvousServer::~RendezvousServer() { shutdown(); }

int RendezvousServer::port() const { return impl_->port; }

std::string RendezvousServer::endpoint() const {
  return formatHostPort(impl_->options.host, impl_->port);
}

std::shared_ptr<grpc::Channel> RendezvousServer::inProcessChannel() {
  return impl_->server->InProcessChannel(grpc::ChannelArguments());
}

size_t RendezvousServer::runCount() const { return impl_->core.runCount(); }

int64_t RendezvousServer::heldBytes() const { return impl_->core.heldBytes(); }

bool RendezvousServer::waitUntilSettled(const std::string& run_id,
                                        std::chrono::milliseconds timeout) {
  return impl_->core.waitUntilSettled(run_id, timeout);
}

JoinPoll RendezvousServer::join(const std::string& run_id, const NodeSpec& node,
                                const RunSettings& settings, Millis poll,
                                const std::atomic<bool>& cancelled) {
  return impl_->core.joinHere(run_id, node, settings, poll, cancelled);
}

Verdict RendezvousServer::keepAlive(const std::string& run_id, const std::string& node_id,
                                    int64_t round, const std::vector<WorkerProgress>& workers) {
  return impl_->core.callHere(run_id, [&](RunState& state, SteadyTime now) {
    impl_->core.report(state, node_id, workers);
    return state.keepAlive(node_id, round, now);
  });
}

Verdict RendezvousServer::requestRestart(const std::string& run_id, const std::string& node_id,
                                         int64_t round, const FailureReport& failure) {
  return impl_->core.callHere(run_id, [&](RunState& state, SteadyTime now) {
    return state.requestRestart(node_id, round, impl_->core.failureToKeep(failure), now);
  });
}

Verdict RendezvousServer::leave(const std::string& run_id, const std::string& node_id,
                                int64_t round) {
  return impl_->core.callHere(
      run_id, [&](RunState& state, SteadyTime now) { return state.leave(node_id, round, now); });
}

void RendezvousServer::wakeJoins() { impl_->core.wakeHere(); }

void RendezvousServer::shutdown() {
  if (!impl_->server) return;
  impl_->core.stop();  // answers parked calls first, so Shutdown does not wait for them
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  impl_->joins.close();  // the queue closes after the server, as gRPC requires
}

void RendezvousServer::wait() {
  if (impl_->server) impl_->server->Wait();
}

}  // namespace cxxlaunch::rendezvous
