#include "rendezvous/server/core.h"

#include <algorithm>
#include <cctype>

namespace cxxlaunch::rendezvous::server {

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

void ParkedReactor::OnCancel() { core_->cancelled(this, run_id_); }

void Core::stop() {
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

grpc::Status Core::authorize(const grpc::ServerContextBase& ctx) const {
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

void Core::cancelled(ParkedCall* parked, const std::string& run_id) {
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

JoinPoll Core::joinHere(const std::string& run_id, const NodeSpec& node,
                        const RunSettings& settings, Millis poll,
                        const std::atomic<bool>& cancelled) {
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
    if (deadline > now) ensureTicker();  // a round that waits closes by the ticker's clock
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

void Core::wakeHere() {
  { std::lock_guard<std::mutex> lock(mu_); }
  here_.notify_all();
}

void Core::checkRunning() const {
  if (stopping_) throw CommunicationError("the rendezvous server is shutting down");
}

Run& Core::runOf(const std::string& run_id) {
  validateRunId(run_id);
  auto it = runs_.find(run_id);
  if (it == runs_.end()) {
    throw StaleError("no run '" + run_id +
                     "' on this server: its nodes have not joined yet, or it ended more than "
                     "the server's run retention ago");
  }
  return *it->second;
}

Run& Core::join(const std::string& run_id, const NodeSpec& node, const RunSettings& settings,
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

void Core::report(RunState& state, const std::string& node_id,
                  std::vector<WorkerProgress> workers) {
  if (workers.empty()) return;
  if (!budget_.fits(static_cast<int64_t>(workers.size()) * RunState::kWorkerBytes)) return;
  state.reportWorkers(node_id, std::move(workers));
}

FailureReport Core::failureToKeep(const FailureReport& failure) const {
  const auto size =
      static_cast<int64_t>(std::min(failure.description.size(), kMaxFailureDescriptionBytes));
  if (budget_.fits(2 * size)) return failure;  // kept twice: the root cause and the reason
  FailureReport kept = failure;
  kept.description = truncateDescription(failure.description, 0);
  return kept;
}

MemoryStore& Core::storeOf(const rdzv::Scope& scope, const std::vector<std::string>& writes) {
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

size_t Core::runCount() {
  std::lock_guard<std::mutex> lock(mu_);
  return runs_.size();
}

bool Core::waitUntilSettled(const std::string& run_id, Millis timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return changed_.wait_for(lock, timeout, [&] {
    auto it = runs_.find(run_id);
    return stopping_ || (it != runs_.end() && it->second->state.everyoneInformed());
  });
}

std::optional<grpc::Status> Core::tryAttempt(const Attempt& attempt, bool expired) {
  std::optional<grpc::Status> result;
  grpc::Status error = wire::guarded([&] {
    result = attempt(expired);
    return grpc::Status::OK;
  });
  if (!error.ok()) return error;
  return result;
}

void Core::recheck(Run& run, SteadyTime now, Ready& ready) {
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

bool Core::tickerMustWake(const std::string& run_id, std::optional<SteadyTime> extra) {
  auto it = runs_.find(run_id);
  if (it == runs_.end()) return false;
  if (it->second->state.finalState()) return true;
  std::optional<SteadyTime> deadline = it->second->state.nextDeadline();
  if (extra && (!deadline || *extra < *deadline)) deadline = extra;
  if (auto at = expiry(*it->second); at && (!deadline || *at < *deadline)) deadline = at;
  return deadline && (!wake_at_ || *deadline < *wake_at_);
}

void Core::recheck(const std::string& run_id, SteadyTime now, Ready& ready) {
  auto it = runs_.find(run_id);
  if (it != runs_.end()) recheck(*it->second, now, ready);
}

void Core::touch(const std::string& run_id, SteadyTime now) {
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

void Core::count(Run& run) {
  const int64_t now = run.state.memoryBytes();
  budget_.adjust(now - run.counted);
  run.counted = now;
}

std::optional<SteadyTime> Core::expiry(const Run& run) const {
  if (!run.parked.empty() || run.state.hasLiveNodes()) return std::nullopt;
  return run.last_call + options_.run_retention;
}

void Core::sweep(SteadyTime now) {
  for (auto it = runs_.begin(); it != runs_.end();) {
    auto at = expiry(*it->second);
    if (at && now >= *at) {
      it = runs_.erase(it);
    } else {
      ++it;
    }
  }
}

void Core::ensureTicker() {
  if (!ticker_.joinable() && !stopping_) ticker_ = std::thread([this] { tickLoop(); });
}

void Core::tickLoop() {
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

}  // namespace cxxlaunch::rendezvous::server
