// The etcd backend's client, store and rendezvous against a real etcd (support/etcd.h): no
// mock stands in for etcd's transactions, leases, watches or auth.

#include "support/etcd.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <exception>
#include <fstream>
#include <optional>
#include <thread>

#include "common/error.h"
#include "rendezvous/etcd_client.h"
#include "rendezvous/etcd_rendezvous.h"
#include "rendezvous/etcd_store.h"
#include "support/subprocess.h"

using namespace cxxlaunch;
using namespace cxxlaunch::rendezvous;
using namespace std::chrono_literals;
using cxxlaunch::testing::EtcdServer;

namespace {

std::shared_ptr<EtcdClient> clientOf(const EtcdServer& etcd, const std::string& user = "",
                                     const std::string& password = "") {
  EtcdOptions o;
  o.endpoints = {etcd.endpoint()};
  o.user = user;
  o.password = password;
  o.call_timeout = 3s;
  return std::make_shared<EtcdClient>(o);
}

RunSettings settingsOf(int min, int max, int restarts = 0) {
  RunSettings s;
  s.min_nodes = min;
  s.max_nodes = max;
  s.last_call_timeout = 500ms;
  s.keep_alive_interval = 300ms;
  s.keep_alive_max_misses = 4;
  s.max_restarts = restarts;
  return s;
}

NodeSpec nodeOf(const std::string& id, int local_world_size = 1) {
  NodeSpec n;
  n.id = id;
  n.addr = "127.0.0.1";
  n.local_world_size = local_world_size;
  n.master_port = 1000 + local_world_size;
  return n;
}

// Polls join until placed or `limit`; no assertion here (it may run on a thread).
std::optional<Placement> joinUntilPlaced(EtcdRendezvous& r, const NodeSpec& n, const RunSettings& s,
                                         std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    auto poll = r.join(n, s, 300ms);
    if (poll.placement) return poll.placement;
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("EtcdStore keeps c10d's store semantics in a real etcd", "[etcd][rendezvous]") {
  EtcdServer etcd;
  auto client = clientOf(etcd);
  // A store needs its round to be current: the rendezvous writes the round key.
  client->run(EtcdOp::put(etcdRoundKey("sem"), "1"));
  EtcdStore store(client, "sem", 1);

  store.set("a", "1");
  CHECK(store.get("a", 1s) == "1");
  CHECK(store.add("n", 5) == 5);
  CHECK(store.add("n", -2) == 3);
  CHECK(store.get("n", 1s) == "3");
  CHECK(store.compareSet("c", "", "x") == "x");         // missing, expected empty: set
  CHECK(store.compareSet("c", "y", "z") == "x");        // wrong expectation: current value
  CHECK(store.compareSet("c", "x", "z") == "z");        // right one: set
  CHECK(store.compareSet("missing", "e", "d") == "e");  // missing, expected given: expected
  CHECK_FALSE(store.check({"missing"}));
  CHECK(store.check({"a", "c"}));
  store.multiSet({"m1", "m2", "m1"}, {"p", "q", "r"});  // the last value of a key wins
  CHECK(store.multiGet({"m1", "m2"}, 1s) == std::vector<std::string>{"r", "q"});
  CHECK(store.numKeys() == 5);  // a, n, c, m1, m2
  CHECK(store.deleteKey("a"));
  CHECK_FALSE(store.deleteKey("a"));
  CHECK(store.numKeys() == 4);
  CHECK_THROWS_AS(store.get("a", 200ms), TimeoutError);
  CHECK_THROWS_AS(store.wait({"c", "nothing"}, 200ms), TimeoutError);
  // Past etcd's request limit (1.5 MiB): refused as the user's to fix, not retried; past gRPC's
  // message limit on etcd's side (2 MiB) the same.
  CHECK_THROWS_WITH(
      store.set("big", std::string(1700 << 10, 'x')),
      Catch::Contains("request is too large") && Catch::Contains("max-request-bytes"));
  CHECK_THROWS_AS(store.set("big", std::string(1700 << 10, 'x')), LimitExceeded);
  CHECK_THROWS_AS(store.set("big", std::string(2 << 20, 'x')), LimitExceeded);
  // The keys live where docs/rendezvous.md says.
  CHECK(client->run(EtcdOp::get("/cxxlaunch/sem/store/1/c")).kvs.at(0).value == "z");

  // A blocking get is woken by the watch when another client sets the key.
  std::optional<std::string> got;
  std::thread waiter([&] {
    try {
      EtcdStore other(clientOf(etcd), "sem", 1);
      got = other.get("later", 10s);
    } catch (const std::exception&) {
    }
  });
  std::this_thread::sleep_for(300ms);
  const auto set_at = std::chrono::steady_clock::now();
  store.set("later", "v");
  waiter.join();
  const auto woke_after = std::chrono::steady_clock::now() - set_at;
  REQUIRE(got);
  CHECK(*got == "v");
  CHECK(woke_after < 2s);  // a watch, not a poll of seconds

  // Counters from many threads: every add counted once (compare-and-swap on the mod revision).
  std::vector<std::thread> adders;
  for (int t = 0; t < 4; ++t) {
    adders.emplace_back([&] {
      EtcdStore mine(clientOf(etcd), "sem", 1);
      for (int i = 0; i < 10; ++i) mine.add("counter", 1);
    });
  }
  for (auto& t : adders) t.join();
  CHECK(store.get("counter", 1s) == "40");
}

TEST_CASE("Etcd rendezvous: one round for all, a write from a stale round is rejected",
          "[etcd][rendezvous]") {
  EtcdServer etcd;
  const RunSettings s = settingsOf(2, 2, /*restarts=*/1);
  EtcdRendezvous a(clientOf(etcd), "fence"), b(clientOf(etcd), "fence");
  std::optional<Placement> pa, pb;
  std::thread ta([&] { pa = joinUntilPlaced(a, nodeOf("node-a", 2), s, 20s); });
  std::thread tb([&] { pb = joinUntilPlaced(b, nodeOf("node-b", 1), s, 20s); });
  ta.join();
  tb.join();
  REQUIRE(pa);
  REQUIRE(pb);
  CHECK(pa->round == 1);
  CHECK(pb->round == 1);
  CHECK(pa->node_rank == 0);  // ranks by id
  CHECK(pb->node_rank == 1);
  CHECK(pa->world_size == 3);
  CHECK(pb->rank_offset == 2);
  CHECK(pb->master_port == 1002);  // node 0's
  CHECK(a.keepAlive("node-a", 1).action == Action::kContinue);
  // A keep-alive's report of the node's workers is what status shows of it (and it goes with the
  // agent's lease: see the keys left at the end).
  const WorkerProgress worker{.local_rank = 1,
                              .rank = 1,
                              .pid = 4242,
                              .state = "stopped",
                              .progress_age = Millis(7000),
                              .steps = 120,
                              .step_us = 52'000,
                              .work_us = 31'000};
  CHECK(a.keepAlive("node-a", 1, {worker}).action == Action::kContinue);
  const RunStatus seen = b.status();
  REQUIRE(seen.participants.size() == 2);
  CHECK(seen.participants[0].workers == std::vector<WorkerProgress>{worker});
  CHECK(seen.participants[0].heartbeat_age < Millis(5000));
  CHECK(seen.participants[1].workers.empty());

  auto client = clientOf(etcd);
  EtcdStore round1(client, "fence", 1);
  round1.set("k", "v1");
  CHECK(round1.get("k", 1s) == "v1");

  // A worker fails: the restart supersedes round 1 ...
  const Verdict restart = b.requestRestart("node-b", 1, {"node-b", 2, 3, "rank 2 exit 3"});
  CHECK(restart.action == Action::kRestart);
  CHECK(a.keepAlive("node-a", 1).action == Action::kRestart);
  // ... and round 1's store is fenced off: its writes and reads are rejected, its keys gone.
  CHECK_THROWS_AS(round1.set("k", "late"), StaleError);
  CHECK_THROWS_WITH(round1.add("n", 1), Catch::Contains("round 1 of run 'fence' is stale") &&
                                            Catch::Contains("round 2"));
  CHECK_THROWS_AS(round1.get("k", 1s), StaleError);
  CHECK(client->run(EtcdOp::prefix("/cxxlaunch/fence/store/1/", true)).count == 0);

  // Round 2 forms from the same nodes and its store works.
  std::thread ta2([&] { pa = joinUntilPlaced(a, nodeOf("node-a", 2), s, 20s); });
  std::thread tb2([&] { pb = joinUntilPlaced(b, nodeOf("node-b", 1), s, 20s); });
  ta2.join();
  tb2.join();
  REQUIRE(pa);
  REQUIRE(pb);
  CHECK(pa->round == 2);
  CHECK(pa->restart_count == 1);
  EtcdStore round2(client, "fence", 2);
  round2.set("k", "v2");
  CHECK(round2.get("k", 1s) == "v2");

  // The second failure has no restart left: the job fails with its root cause.
  const Verdict failed = a.requestRestart("node-a", 2, {"node-a", 0, 7, "rank 0 exit 7"});
  CHECK(failed.action == Action::kFail);
  REQUIRE(b.keepAlive("node-b", 2).root_cause);
  CHECK(b.keepAlive("node-b", 2).root_cause->exit_code == 7);
  CHECK_THROWS_AS(round2.set("k", "after the end"), StaleError);
  // A late node is refused at once, and the run's keys are gone but for its final state.
  EtcdRendezvous late(clientOf(etcd), "fence");
  CHECK_THROWS_WITH(late.join(nodeOf("node-c"), s, 1s), Catch::Contains("has failed"));
  a.close();
  b.close();
  late.close();
  const auto left = client->run(EtcdOp::prefix("/cxxlaunch/fence/"));
  REQUIRE(left.kvs.size() == 1);
  CHECK(left.kvs[0].key == "/cxxlaunch/fence/state");
  CHECK(left.kvs[0].lease != 0);  // kept for kEtcdFinalStateRetention, then gone
}

TEST_CASE("Etcd rendezvous: a node whose lease is gone is evicted, the run closes when all finish",
          "[etcd][rendezvous]") {
  EtcdServer etcd;
  const RunSettings s = settingsOf(1, 3);
  auto a = std::make_unique<EtcdRendezvous>(clientOf(etcd), "evict");
  auto b = std::make_unique<EtcdRendezvous>(clientOf(etcd), "evict");
  std::optional<Placement> pa, pb;
  std::thread ta([&] { pa = joinUntilPlaced(*a, nodeOf("a"), s, 20s); });
  std::thread tb([&] { pb = joinUntilPlaced(*b, nodeOf("b"), s, 20s); });
  ta.join();
  tb.join();
  REQUIRE(pa);
  REQUIRE(pb);
  // Both were in one round before the last call (500 ms) passed, or the second re-formed it.
  if (pa->round != pb->round) {
    pa = joinUntilPlaced(*a, nodeOf("a"), s, 20s);
    pb = joinUntilPlaced(*b, nodeOf("b"), s, 20s);
  }
  REQUIRE(pa);
  REQUIRE(pb);
  REQUIRE(pa->num_nodes == 2);
  const int64_t round = pa->round;

  // b's agent goes away (its lease revoked, as an expiry would): a's next keep-alive evicts it.
  b->close();
  const Verdict v = a->keepAlive("a", round);
  CHECK(v.action == Action::kRestart);
  CHECK_THAT(v.reason, Catch::Contains("evicted b"));
  pa = joinUntilPlaced(*a, nodeOf("a"), s, 20s);
  REQUIRE(pa);
  CHECK(pa->num_nodes == 1);  // elastic: min 1
  CHECK(pa->round == round + 1);
  CHECK(pa->restart_count == 0);  // membership changes spend no restart
  CHECK(a->leave("a", pa->round).action == Action::kClosed);
  EtcdRendezvous late(clientOf(etcd), "evict");
  CHECK_THROWS_WITH(late.join(nodeOf("c"), s, 1s), Catch::Contains("is closed"));
  CHECK_THROWS_WITH(late.join(nodeOf("c"), settingsOf(1, 2), 1s),
                    Catch::Contains("every node must use the same"));
}

// Joining writes one key per node (round/<r>/node/<id>), not the shared state: the round fills up
// to max, the node beyond it waits for room and gets into the next round; static ranks are
// unique, and static and dynamic nodes do not mix.
TEST_CASE("Etcd rendezvous: join keys, a node beyond max waits for the next round, static ranks",
          "[etcd][rendezvous]") {
  EtcdServer etcd;
  auto client = clientOf(etcd);
  const RunSettings s = settingsOf(4, 4);
  std::vector<std::unique_ptr<EtcdRendezvous>> agents;
  std::vector<std::optional<Placement>> placed(5);
  for (int i = 0; i < 5; ++i) agents.push_back(std::make_unique<EtcdRendezvous>(client, "keys"));
  std::vector<std::thread> threads;
  for (int i = 0; i < 5; ++i) {
    threads.emplace_back([&, i] {
      placed[i] = joinUntilPlaced(*agents[i], nodeOf("n" + std::to_string(i)), s, 3s);
    });
  }
  for (auto& t : threads) t.join();
  int waiting = -1;
  for (int i = 0; i < 5; ++i) {
    if (!placed[i]) {
      CHECK(waiting == -1);  // one only
      waiting = i;
    }
  }
  REQUIRE(waiting >= 0);
  const NodeSpec late = nodeOf("n" + std::to_string(waiting));
  CHECK_THAT(agents[waiting]->join(late, s, 100ms).waiting_for,
             Catch::Contains("running with 4 of 4 nodes") && Catch::Contains("waits for room"));
  // The completed round's join keys are gone; the state holds the participants.
  CHECK(client->run(EtcdOp::prefix("/cxxlaunch/keys/round/", true)).count == 0);
  CHECK(agents[waiting]->status().waiting.size() == 1);

  // A participant goes away: its eviction starts round 2, which the waiting node joins.
  const int gone = waiting == 0 ? 1 : 0;
  int survivor = 0;
  while (survivor == gone || survivor == waiting) ++survivor;
  agents[gone]->close();
  CHECK_THAT(agents[survivor]->keepAlive("n" + std::to_string(survivor), 1).reason,
             Catch::Contains("evicted n" + std::to_string(gone)));
  threads.clear();
  for (int i = 0; i < 5; ++i) {
    if (i == gone) continue;
    threads.emplace_back([&, i] {
      placed[i] = joinUntilPlaced(*agents[i], nodeOf("n" + std::to_string(i)), s, 20s);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 5; ++i) {
    if (i == gone) continue;
    REQUIRE(placed[i]);
    CHECK(placed[i]->round == 2);
    CHECK(placed[i]->num_nodes == 4);
  }

  // Static ranks: one key per rank.
  const RunSettings two = settingsOf(2, 2);
  EtcdRendezvous a(client, "static"), b(client, "static"), c(client, "static"), d(client, "static");
  NodeSpec sa = nodeOf("s-a"), sb = nodeOf("s-b"), sc = nodeOf("s-c");
  sa.node_rank = 1;
  sb.node_rank = 1;
  sc.node_rank = 0;
  CHECK_FALSE(a.join(sa, two, 100ms).placement);
  CHECK_THROWS_WITH(b.join(sb, two, 100ms), Catch::Contains("node rank 1 is already taken by "
                                                            "node s-a"));
  CHECK_THROWS_WITH(d.join(nodeOf("dynamic"), two, 100ms),
                    Catch::Contains("mixes static and dynamic"));
  const auto pc = joinUntilPlaced(c, sc, two, 10s);
  const auto pa = joinUntilPlaced(a, sa, two, 10s);
  REQUIRE(pc);
  REQUIRE(pa);
  CHECK(pc->node_rank == 0);  // by --node_rank, not by id
  CHECK(pa->node_rank == 1);
}

// A join waits on one watch stream (not one per 250 ms: thousands of those made etcd replay its
// history over and over); cancel() ends that stream at once.
TEST_CASE("Etcd rendezvous: cancel() ends a join that waits on its watch", "[etcd][rendezvous]") {
  EtcdServer etcd;
  EtcdRendezvous r(clientOf(etcd), "cancel");
  std::thread canceller([&] {
    std::this_thread::sleep_for(500ms);
    r.cancel();
  });
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(r.join(nodeOf("a"), settingsOf(2, 2), 20s), CommunicationError);
  CHECK(std::chrono::steady_clock::now() - start < 3s);
  canceller.join();
}

// A stopped etcd (SIGSTOP: its kernel still accepts, nothing answers) costs a keep-alive its own
// deadline, not the client's call timeout, and close() does not wait on it: a launcher with
// keep-alives of 1 s x 3 noticed it after 6.2 s, each call waiting the whole call timeout.
TEST_CASE("Etcd rendezvous: a stopped etcd costs a keep-alive its deadline and close() nothing",
          "[etcd][rendezvous]") {
  EtcdServer etcd;
  EtcdRendezvous r(clientOf(etcd), "stopped");  // a call timeout of 3 s
  const auto placed = joinUntilPlaced(r, nodeOf("a"), settingsOf(1, 1), 20s);
  REQUIRE(placed);
  CHECK(r.keepAlive("a", placed->round, {}, 300ms).action == Action::kContinue);
  REQUIRE(::kill(etcd.pid(), SIGSTOP) == 0);
  struct Resume {
    pid_t pid;
    ~Resume() { ::kill(pid, SIGCONT); }
  } resume{etcd.pid()};
  // The signal is delivered asynchronously: wait until etcd is stopped ('T' in its stat line,
  // after the command name's closing parenthesis), or a busy machine lets it answer once more.
  auto stopped = [&] {
    std::ifstream stat("/proc/" + std::to_string(etcd.pid()) + "/stat");
    const std::string line((std::istreambuf_iterator<char>(stat)),
                           std::istreambuf_iterator<char>());
    const auto paren = line.rfind(')');
    return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'T';
  };
  for (int i = 0; i < 200 && !stopped(); ++i) std::this_thread::sleep_for(10ms);
  REQUIRE(stopped());
  auto start = std::chrono::steady_clock::now();
  REQUIRE_THROWS_AS(r.keepAlive("a", placed->round, {}, 300ms), TimeoutError);
  CHECK(std::chrono::steady_clock::now() - start < 1s);
  std::this_thread::sleep_for(500ms);  // the lease's keeper renews meanwhile, and hangs
  start = std::chrono::steady_clock::now();
  r.close();
  CHECK(std::chrono::steady_clock::now() - start < 500ms);
}

TEST_CASE("The etcd client fails over to the next endpoint and names them when none answers",
          "[etcd][rendezvous]") {
  EtcdServer etcd;
  const std::string dead = "127.0.0.1:" + std::to_string(cxxlaunch::testing::freePort());
  EtcdOptions o;
  o.endpoints = parseEtcdEndpoints("etcd://" + dead + "," + etcd.endpoint());
  REQUIRE(o.endpoints.size() == 2);
  o.call_timeout = 2s;
  EtcdClient client(o);
  client.run(EtcdOp::put("/failover", "yes"));
  CHECK(client.run(EtcdOp::get("/failover")).kvs.at(0).value == "yes");

  o.endpoints = {dead};
  EtcdClient nowhere(o);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(nowhere.run(EtcdOp::get("/x")),
                    Catch::Contains("no member reachable at " + dead));
  CHECK(std::chrono::steady_clock::now() - start < 3s);
  CHECK_THROWS_AS(parseEtcdEndpoints("etcd://h1:2379,,h2"), InvalidArgument);
  CHECK(parseEtcdEndpoints("http://h1,h2:1") == std::vector<std::string>{"h1:2379", "h2:1"});
  // The workers' store URL carries the key root after the members.
  const std::string url = etcdEndpointUrl({"h1:1", "h2:2"}, etcdRoot("/team/jobs"));
  CHECK(url == "etcd://h1:1,h2:2/team/jobs/");
  CHECK(parseEtcdEndpoints(url) == std::vector<std::string>{"h1:1", "h2:2"});
  CHECK(etcdRootOf(url) == "/team/jobs/");
  CHECK(etcdRootOf("etcd://h1:1") == kEtcdRoot);
  CHECK(etcdRoot("/x/") == "/x/");
  CHECK_THROWS_WITH(etcdRoot("x"), Catch::Contains("must start with '/'"));
  CHECK_THROWS_AS(etcdRoot("/a b"), InvalidArgument);
  CHECK_THROWS_AS(etcdRoot(""), InvalidArgument);
}

TEST_CASE("With etcd auth on, the right password works and a wrong one is refused clearly",
          "[etcd][rendezvous][security]") {
  EtcdServer etcd;
  etcd.enableAuth("secret");
  auto good = clientOf(etcd, "root", "secret");
  good->run(EtcdOp::put(etcdRoundKey("auth"), "1"));
  EtcdStore store(good, "auth", 1);
  store.set("k", "v");
  CHECK(store.get("k", 1s) == "v");
  // Watches carry the token too: a blocking get is woken.
  std::optional<std::string> got;
  std::thread waiter([&] {
    try {
      EtcdStore other(clientOf(etcd, "root", "secret"), "auth", 1);
      got = other.get("later", 10s);
    } catch (const std::exception&) {
    }
  });
  std::this_thread::sleep_for(300ms);
  store.set("later", "w");
  waiter.join();
  CHECK(got == std::optional<std::string>("w"));

  auto wrong = clientOf(etcd, "root", "not-the-password");
  CHECK_THROWS_AS(wrong->run(EtcdOp::get("/x")), InvalidArgument);
  CHECK_THROWS_WITH(wrong->run(EtcdOp::get("/x")), Catch::Contains("refused user 'root'") &&
                                                       Catch::Contains("authentication failed"));
  auto anonymous = clientOf(etcd);
  CHECK_THROWS_WITH(anonymous->run(EtcdOp::get("/x")), Catch::Contains("requires auth"));
}
