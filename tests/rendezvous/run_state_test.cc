// The rendezvous state machine on a fake clock: no test here sleeps.

#include "rendezvous/run_state.h"

#include <catch2/catch.hpp>
#include <cstdio>

using namespace cxxlaunch;
using namespace cxxlaunch::rendezvous;
using namespace std::chrono_literals;

namespace {

struct Fixture {
  SteadyTime now = SteadyTime{} + 1000s;

  static RunSettings settings(int min, int max, int max_restarts = 0) {
    RunSettings s;
    s.min_nodes = min;
    s.max_nodes = max;
    s.max_restarts = max_restarts;
    s.last_call_timeout = 10s;
    s.keep_alive_interval = 5s;
    s.keep_alive_max_misses = 3;
    return s;
  }
  static NodeSpec node(const std::string& id, int local = 2, int rank = -1) {
    NodeSpec n;
    n.id = id;
    n.addr = "host-" + id;
    n.local_world_size = local;
    n.master_port = 20000 + static_cast<int>(id[0]);
    n.node_rank = rank;
    return n;
  }
};

}  // namespace

TEST_CASE_METHOD(Fixture, "One node of one completes at once", "[run_state]") {
  RunState run("job", settings(1, 1));
  auto p = run.join(node("a", 4), settings(1, 1), now);
  REQUIRE(p);
  CHECK(p->round == 1);
  CHECK(p->node_rank == 0);
  CHECK(p->world_size == 4);
  CHECK(p->master_addr == "host-a");
  CHECK(p->master_port == 20000 + 'a');
}

TEST_CASE_METHOD(Fixture, "Ranks follow sorted ids and offsets are prefix sums", "[run_state]") {
  const auto s = settings(3, 3);
  RunState run("job", s);
  CHECK_FALSE(run.join(node("c", 1), s, now));
  CHECK_FALSE(run.join(node("a", 4), s, now));
  auto b = run.join(node("b", 2), s, now);  // the third join completes the round
  REQUIRE(b);
  auto a = run.placementOf("a"), c = run.placementOf("c");
  REQUIRE(a);
  REQUIRE(c);
  CHECK(a->node_rank == 0);
  CHECK(b->node_rank == 1);
  CHECK(c->node_rank == 2);
  CHECK(a->rank_offset == 0);
  CHECK(b->rank_offset == 4);
  CHECK(c->rank_offset == 6);
  CHECK(c->world_size == 7);
  CHECK(b->master_addr == "host-a");
  // Asking again gives the same answer.
  CHECK(run.join(node("c", 1), s, now)->rank_offset == 6);
}

TEST_CASE_METHOD(Fixture, "Static node ranks decide the order", "[run_state]") {
  const auto s = settings(2, 2);
  RunState run("job", s);
  CHECK_FALSE(run.join(node("z", 1, 0), s, now));
  REQUIRE_THROWS_WITH(run.join(node("y", 1, 0), s, now),
                      Catch::Contains("already taken by node z"));
  REQUIRE_THROWS_WITH(run.join(node("x", 1, 2), s, now), Catch::Contains("out of range"));
  REQUIRE_THROWS_WITH(run.join(node("w", 1, -1), s, now), Catch::Contains("mixes static"));
  CHECK_THAT(run.waitingFor(), Catch::Contains("missing node ranks: 1"));
  auto a = run.join(node("a", 1, 1), s, now);
  REQUIRE(a);
  CHECK(a->node_rank == 1);
  CHECK(a->master_addr == "host-z");
}

TEST_CASE_METHOD(Fixture, "Between min and max the last call decides", "[run_state]") {
  const auto s = settings(2, 3);
  RunState run("job", s);
  CHECK_FALSE(run.join(node("a"), s, now));
  CHECK_FALSE(run.join(node("b"), s, now + 1s));  // min reached: the last call starts
  REQUIRE(run.nextDeadline());
  CHECK(*run.nextDeadline() <= now + 11s);
  CHECK_FALSE(run.tick(now + 10s));
  CHECK_FALSE(run.placementOf("a"));
  CHECK(run.tick(now + 11s));
  auto a = run.placementOf("a");
  REQUIRE(a);
  CHECK(a->num_nodes == 2);
}

TEST_CASE_METHOD(Fixture, "Reaching max completes without waiting", "[run_state]") {
  const auto s = settings(1, 2);
  RunState run("job", s);
  CHECK_FALSE(run.join(node("a"), s, now));
  REQUIRE(run.join(node("b"), s, now));
}

TEST_CASE_METHOD(Fixture, "Every node must bring the run's settings", "[run_state]") {
  RunState run("job", settings(2, 2));
  REQUIRE_THROWS_AS(run.join(node("a"), settings(2, 3), now), InvalidArgument);
  REQUIRE_THROWS_WITH(run.join(node("a"), settings(2, 3), now),
                      Catch::Contains("was started with nnodes 2:2"));
  auto bad = settings(2, 2);
  bad.keep_alive_interval = -1s;
  REQUIRE_THROWS_WITH(run.join(node("a"), bad, now), Catch::Contains("keep_alive_interval"));
  REQUIRE_THROWS_AS(RunState("x", settings(3, 2)), InvalidArgument);
  auto n = node("a");
  n.local_world_size = 0;
  REQUIRE_THROWS_WITH(run.join(n, settings(2, 2), now), Catch::Contains("local world size"));
}

TEST_CASE_METHOD(Fixture, "A silent node is evicted and the survivors re-form smaller",
                 "[run_state]") {
  const auto s = settings(2, 3);
  RunState run("job", s);
  run.join(node("a"), s, now);
  run.join(node("b"), s, now);
  REQUIRE(run.join(node("c"), s, now));
  // a and b keep alive; c goes silent.
  for (int t = 5; t <= 15; t += 5) {
    CHECK(run.keepAlive("a", 1, now + std::chrono::seconds(t)).action == Action::kContinue);
    CHECK(run.keepAlive("b", 1, now + std::chrono::seconds(t)).action == Action::kContinue);
    CHECK_FALSE(run.tick(now + std::chrono::seconds(t)));
  }
  CHECK(run.tick(now + 15s + 2ms));  // 15 s without a keep-alive from c
  CHECK(run.round() == 2);
  auto verdict = run.keepAlive("a", 1, now + 16s);
  CHECK(verdict.action == Action::kRestart);
  CHECK_THAT(verdict.reason, Catch::Contains("evicted c"));
  // The evicted node is fenced: its old round is stale for the store and for keep-alives.
  CHECK(run.keepAlive("c", 1, now + 16s).action == Action::kRestart);
  REQUIRE_THROWS_AS(run.checkStoreRound(1), StaleError);
  CHECK_THAT(run.waitingFor(), Catch::Contains("missing from the previous round: a, b"));
  // Both survivors back: no last call needed.
  CHECK_FALSE(run.join(node("a"), s, now + 16s));
  auto b = run.join(node("b"), s, now + 16s);
  REQUIRE(b);
  CHECK(b->round == 2);
  CHECK(b->num_nodes == 2);
  CHECK(b->world_size == 4);
  CHECK(b->restart_count == 0);  // membership changes spend no restart
  run.checkStoreRound(2);
}

TEST_CASE_METHOD(Fixture, "A node joining a running round is admitted at the next round",
                 "[run_state]") {
  const auto s = settings(2, 3);
  RunState run("job", s);
  run.join(node("a"), s, now);
  run.join(node("b"), s, now);
  run.tick(now + 10s);
  REQUIRE(run.placementOf("a"));
  CHECK_FALSE(run.join(node("c", 1), s, now + 12s));
  CHECK(run.round() == 2);
  auto verdict = run.keepAlive("b", 1, now + 13s);
  CHECK(verdict.action == Action::kRestart);
  CHECK_THAT(verdict.reason, Catch::Contains("node c joined"));
  run.join(node("a"), s, now + 13s);
  auto b = run.join(node("b"), s, now + 13s);  // max reached
  REQUIRE(b);
  CHECK(b->num_nodes == 3);
  CHECK(b->world_size == 5);
  CHECK(run.placementOf("c"));
}

TEST_CASE_METHOD(Fixture, "A node beyond max waits without disturbing the round", "[run_state]") {
  const auto s = settings(1, 2);
  RunState run("job", s);
  run.join(node("a"), s, now);
  REQUIRE(run.join(node("b"), s, now));
  CHECK_FALSE(run.join(node("c"), s, now + 1s));
  CHECK(run.round() == 1);
  CHECK(run.keepAlive("a", 1, now + 2s).action == Action::kContinue);
  CHECK(run.status(now + 2s).waiting.size() == 1);
}

TEST_CASE_METHOD(Fixture, "Restarts are global, counted once per round, and bounded",
                 "[run_state]") {
  const auto s = settings(2, 2, /*max_restarts=*/1);
  RunState run("job", s);
  run.join(node("a"), s, now);
  REQUIRE(run.join(node("b"), s, now));
  FailureReport failure{"b", 3, 1, "rank 3 exit 1"};
  auto first = run.requestRestart("b", 1, failure, now);
  CHECK(first.action == Action::kRestart);
  // a's workers failed too (peer lost): same round, no second restart spent.
  CHECK(run.requestRestart("a", 1, {"a", 0, 1, "rank 0 exit 1"}, now).action == Action::kRestart);
  run.join(node("a"), s, now);
  auto again = run.join(node("b"), s, now);
  REQUIRE(again);
  CHECK(again->restart_count == 1);
  FailureReport second{"a", 1, 139, "rank 1 SIGSEGV (11)"};
  auto last = run.requestRestart("a", 2, second, now);
  CHECK(last.action == Action::kFail);
  REQUIRE(last.root_cause);
  CHECK(last.root_cause->exit_code == 139);
  auto b = run.keepAlive("b", 2, now);
  CHECK(b.action == Action::kFail);
  CHECK(b.root_cause->description == "rank 1 SIGSEGV (11)");
  REQUIRE_THROWS_WITH(run.join(node("d"), s, now), Catch::Contains("failed after 1 restarts"));
}

TEST_CASE_METHOD(Fixture, "The run closes when every node left, and joins then fail fast",
                 "[run_state]") {
  const auto s = settings(2, 2);
  RunState run("job", s);
  run.join(node("a"), s, now);
  REQUIRE(run.join(node("b"), s, now));
  CHECK(run.leave("a", 1, now).action == Action::kContinue);
  CHECK(run.keepAlive("a", 1, now).action == Action::kContinue);
  CHECK(run.leave("b", 1, now).action == Action::kClosed);
  CHECK(run.keepAlive("a", 1, now).action == Action::kClosed);
  REQUIRE_THROWS_WITH(run.checkStoreRound(1), Catch::Contains("store is gone"));
  REQUIRE_THROWS_AS(run.join(node("c"), s, now), StaleError);
  REQUIRE_THROWS_WITH(run.join(node("c"), s, now), Catch::Contains("is closed"));
  CHECK_FALSE(run.tick(now + 1h));
  CHECK_FALSE(run.nextDeadline());
}

TEST_CASE_METHOD(Fixture, "A world past the rank limit is refused at the join that would make it",
                 "[run_state]") {
  const auto s = settings(1, 65536);
  RunState run("job", s);
  const int nodes = static_cast<int>(kMaxWorldSize / 65536);  // 256 full nodes fit exactly
  for (int i = 0; i < nodes; ++i) run.join(node("n" + std::to_string(100000 + i), 65536), s, now);
  REQUIRE_THROWS_WITH(run.join(node("straw", 1), s, now), Catch::Contains("would make the world"));
  CHECK(run.status(now).participants.size() == static_cast<size_t>(nodes));
  REQUIRE(run.tick(now + 11s));  // the last call completes the round
  auto placement = run.placementOf("n100255");
  REQUIRE(placement);
  CHECK(placement->world_size == kMaxWorldSize);
  CHECK(placement->rank_offset == kMaxWorldSize - 65536);
}

TEST_CASE_METHOD(Fixture, "Store calls are fenced by the round", "[run_state]") {
  const auto s = settings(1, 2);
  RunState run("job", s);
  run.join(node("a"), s, now);
  REQUIRE_THROWS_WITH(run.checkStoreRound(1), Catch::Contains("not complete yet"));
  run.join(node("b"), s, now);
  run.checkStoreRound(1);
  REQUIRE_THROWS_AS(run.checkStoreRound(2), StaleError);
  run.requestRestart("a", 1, {"a", 0, 1, "x"}, now);  // max_restarts 0: the run fails
  REQUIRE_THROWS_AS(run.checkStoreRound(1), StaleError);
}

TEST_CASE_METHOD(Fixture, "Status reports heartbeat ages and waiting nodes", "[run_state]") {
  const auto s = settings(2, 2);
  RunState run("job", s);
  run.join(node("a"), s, now);
  auto status = run.status(now + 3s);
  CHECK(status.state == "joining");
  REQUIRE(status.participants.size() == 1);
  CHECK(status.participants[0].heartbeat_age == 3s);
  run.join(node("b"), s, now + 3s);
  status = run.status(now + 4s);
  CHECK(status.state == "running");
  CHECK(status.participants[1].node_rank == 1);
}

TEST_CASE_METHOD(Fixture, "Joining nodes that go silent are dropped", "[run_state]") {
  const auto s = settings(3, 3);
  RunState run("job", s);
  run.join(node("a"), s, now);
  run.join(node("b"), s, now + 10s);
  CHECK(run.tick(now + 16s));  // a has been silent for 16 s
  CHECK(run.status(now + 16s).participants.size() == 1);
  CHECK_THAT(run.waitingFor(), Catch::Contains("1 of 3 nodes joined (b)"));
}

TEST_CASE_METHOD(Fixture, "A finished run is settled once every node has been told",
                 "[run_state]") {
  const auto s = settings(2, 2);
  RunState run("job", s);
  run.join(node("a"), s, now);
  run.join(node("b"), s, now);
  const auto epoch = run.epoch();
  CHECK_FALSE(run.everyoneInformed());
  run.leave("a", 1, now);
  run.leave("b", 1, now);  // b learns "closed" from this answer
  CHECK(run.epoch() != epoch);
  CHECK_FALSE(run.everyoneInformed());
  CHECK(run.keepAlive("a", 1, now).action == Action::kClosed);
  CHECK(run.everyoneInformed());
}

// ---- workers' progress, for `cxxlaunch status` ------------------------------------------------

namespace {

WorkerProgress worker(int rank, const std::string& state, std::optional<Millis> age) {
  WorkerProgress w;
  w.local_rank = rank;
  w.rank = rank;
  w.pid = 100 + rank;
  w.state = state;
  w.progress_age = age;
  return w;
}

}  // namespace

TEST_CASE_METHOD(Fixture, "Status shows each node's last report of its workers", "[run_state]") {
  const auto s = settings(1, 1);
  RunState run("job", s);
  run.join(node("a", 2), s, now);
  run.reportWorkers("a", {worker(0, "sleeping", 100ms), worker(1, "stopped", 7s)});
  auto status = run.status(now);
  REQUIRE(status.participants.size() == 1);
  CHECK(status.participants[0].workers ==
        std::vector<WorkerProgress>{worker(0, "sleeping", 100ms), worker(1, "stopped", 7s)});
  // The next report replaces it; one that never beat has no age.
  run.reportWorkers("a", {worker(0, "running", std::nullopt), worker(1, "exited", 9s)});
  status = run.status(now);
  CHECK(status.participants[0].workers[0].progress_age == std::nullopt);
  CHECK(status.participants[0].workers[1].state == "exited");
}

TEST_CASE_METHOD(Fixture, "Worker reports are bounded by the node's size and dropped with it",
                 "[run_state]") {
  const auto s = settings(1, 2, 1);
  RunState run("job", s);
  run.join(node("a", 1), s, now);
  run.tick(now + 11s);  // last call: a alone
  REQUIRE(run.status(now + 11s).state == "running");
  REQUIRE_THROWS_WITH(run.reportWorkers("a", {worker(0, "running", 1s), worker(1, "running", 1s)}),
                      Catch::Contains("reported 2 workers; it has 1"));
  REQUIRE_THROWS_WITH(run.reportWorkers("a", {worker(0, std::string(33, 'x'), 1s)}),
                      Catch::Contains("at most 32 bytes"));
  run.reportWorkers("nobody", {worker(0, "running", 1s)});  // not tracked: ignored
  run.reportWorkers("a", {worker(0, "running", 1s)});
  CHECK(run.status(now + 11s).participants[0].workers.size() == 1);
  // A new round stops the workers: their report goes with them.
  run.requestRestart("a", 1, {"a", 0, 1, "x"}, now + 12s);
  run.join(node("a", 1), s, now + 12s);
  run.tick(now + 23s);
  REQUIRE(run.status(now + 23s).state == "running");
  CHECK(run.status(now + 23s).participants[0].workers.empty());
}

TEST_CASE_METHOD(Fixture, "A large run's waiting message lists 16 ids and counts the rest",
                 "[run_state]") {
  const auto s = settings(100, 100);
  RunState run("job", s);
  for (int i = 0; i < 40; ++i) {
    char id[16];
    std::snprintf(id, sizeof(id), "n%03d", i);
    CHECK_FALSE(run.join(node(id, 1, i), s, now));
  }
  const std::string message = run.waitingFor();
  CHECK_THAT(message, Catch::Contains("40 of 100 nodes joined (n000, n001,"));
  CHECK_THAT(message, Catch::Contains("n015 and 24 more)"));
  CHECK_THAT(message, !Catch::Contains("n016"));
  CHECK_THAT(message, Catch::Contains("missing node ranks: 40, 41,"));
  CHECK_THAT(message, Catch::Contains("55 and 44 more"));
}

TEST_CASE_METHOD(Fixture, "A static rank freed by an eviction can be taken again", "[run_state]") {
  const auto s = settings(3, 3);
  RunState run("job", s);
  CHECK_FALSE(run.join(node("a", 1, 0), s, now));
  CHECK_FALSE(run.join(node("b", 1, 1), s, now + 10s));
  REQUIRE_THROWS_WITH(run.join(node("x", 1, 0), s, now + 10s),
                      Catch::Contains("already taken by node a"));
  CHECK(run.tick(now + 15s + 2ms));  // a is silent: evicted from the joining round
  CHECK_THAT(run.waitingFor(), Catch::Contains("missing node ranks: 0, 2"));
  CHECK_FALSE(run.join(node("x", 1, 0), s, now + 16s));
  auto c = run.join(node("c", 1, 2), s, now + 16s);
  REQUIRE(c);
  CHECK(run.placementOf("x")->node_rank == 0);
  CHECK(c->num_nodes == 3);
}

TEST_CASE_METHOD(Fixture, "A survivor evicted while the others come back is not waited for",
                 "[run_state]") {
  const auto s = settings(1, 3, /*max_restarts=*/1);
  RunState run("job", s);
  run.join(node("a"), s, now);
  run.join(node("b"), s, now);
  REQUIRE(run.join(node("c"), s, now));
  CHECK(run.requestRestart("a", 1, {"a", 0, 1, "boom"}, now + 1s).action == Action::kRestart);
  CHECK_FALSE(run.join(node("a"), s, now + 14s));
  CHECK_FALSE(run.join(node("b"), s, now + 14s));
  CHECK_THAT(run.waitingFor(), Catch::Contains("missing from the previous round: c"));
  // c never comes back: once it is evicted, a and b are everyone expected, so the round
  // completes then, not after the last call.
  CHECK(run.tick(now + 15s + 2ms));
  auto a = run.placementOf("a");
  REQUIRE(a);
  CHECK(a->num_nodes == 2);
  CHECK(a->round == 2);
}
