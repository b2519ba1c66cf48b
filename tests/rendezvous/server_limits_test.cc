// The rendezvous server's limits and lifetimes through real gRPC on loopback (docs/reliability.md):
// bounded stores, bounded totals, failure texts, counters, large answers, closed and old runs.

#include <catch2/catch.hpp>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "rendezvous/client.h"
#include "rendezvous/server.h"
#include "server_fixture.h"

using namespace cxxlaunch;
using namespace cxxlaunch::rendezvous;
using namespace cxxlaunch::rendezvous::server_fixture;
using namespace std::chrono_literals;

TEST_CASE("Each run's store is bounded: a full run is refused, others keep being served",
          "[server][store][limits]") {
  ServerOptions options;
  options.store_limits = {
      .max_keys = 1000, .max_bytes = 8 << 20, .max_key_bytes = 1024, .max_value_bytes = 1 << 20};
  RendezvousServer server(options);
  auto a = soloRun(server, "flood");
  auto b = soloRun(server, "other");
  GrpcStore flood(clientFor(server), "flood", a.round);
  GrpcStore other(clientFor(server), "other", b.round);
  REQUIRE_THROWS_WITH(flood.set(std::string(1'000'000, 'k'), "v"),
                      Catch::Contains("--store-max-key-bytes"));
  REQUIRE_THROWS_WITH(flood.set("k", std::string((1 << 20) + 1, 'v')),
                      Catch::Contains("--store-max-value-bytes"));
  int accepted = 0;
  std::string refusal;
  for (int i = 0; i < 20; ++i) {
    try {
      flood.set("v" + std::to_string(i), std::string(1 << 20, 'x'));
      ++accepted;
    } catch (const LimitExceeded& e) {
      refusal = e.what();
      break;
    }
  }
  CHECK(accepted == 7);  // 8 MiB of keys and values hold seven 1 MiB values, not eight
  CHECK_THAT(refusal, Catch::Contains("--store-max-bytes"));
  CHECK(flood.numKeys() == 7);
  other.set("k", std::string(1 << 20, 'y'));
  CHECK(other.get("k", 1s).size() == 1 << 20);
  for (int i = 0; i < 1000; ++i) other.add("n" + std::to_string(i % 999), 1);
  REQUIRE_THROWS_WITH(other.set("one-too-many", ""), Catch::Contains("--store-max-keys"));
}

// One client with many runs: each run's bound holds, so only the total over all runs can stop it
// (16 runs of 1 MiB values once took cxxlaunchd to 1.06 GB).
TEST_CASE("The server's total over all runs is bounded: past it writes and new joins are refused",
          "[server][store][limits]") {
  ServerOptions options;
  options.max_total_bytes = 12 << 20;
  RendezvousServer server(options);
  std::vector<Placement> runs;
  int accepted = 0;
  std::string refusal;
  for (int i = 0; i < 16; ++i) {
    const std::string id = "flood" + std::to_string(i);
    runs.push_back(soloRun(server, id));
    GrpcStore store(clientFor(server), id, runs.back().round);
    try {
      store.set("v", std::string(1 << 20, 'x'));
      ++accepted;
    } catch (const LimitExceeded& e) {
      refusal = e.what();
    }
  }
  CHECK(accepted == 11);  // 12 MiB hold eleven 1 MiB values beside 16 runs' state, not twelve
  CHECK_THAT(refusal, Catch::Contains("--store-max-total-bytes"));
  // Filled to the brim: a new run cannot join, a known node still can, and a failure keeps only
  // the note that its description was cut.
  GrpcStore brim(clientFor(server), "flood15", runs.back().round);
  for (int i = 0;; ++i) {
    try {
      brim.set("s" + std::to_string(i), std::string(1000, 's'));
    } catch (const LimitExceeded&) {
      break;
    }
  }
  CHECK(server.heldBytes() <= options.max_total_bytes);
  RendezvousClient late(clientFor(server), "late");
  REQUIRE_THROWS_WITH(late.join(node("n"), settings(1, 1), 1s),
                      Catch::Contains("--store-max-total-bytes"));
  RendezvousClient flood0(clientFor(server), "flood0");
  CHECK(flood0.join(node("solo"), settings(1, 1), 1s).placement);
  const auto failed =
      flood0.requestRestart("solo", runs[0].round, {"solo", 0, 1, std::string(64 << 10, 'd')});
  REQUIRE(failed.action == Action::kFail);
  REQUIRE(failed.root_cause);
  CHECK(failed.root_cause->description == "... [65536 more bytes not kept]");
  // The failed run's store is gone, and its bytes are free for a new run.
  CHECK(late.join(node("n"), settings(1, 1), 1s).placement);
}

TEST_CASE("A failure description is kept to 64 KiB, in every run", "[server][rendezvous][limits]") {
  RendezvousServer server({});
  const std::string description(1 << 20, 'd');
  for (int i = 0; i < 16; ++i) {
    RendezvousClient client(clientFor(server), "fail" + std::to_string(i));
    auto placed = joinUntilPlaced(client, node("a"), settings(1, 1, /*max_restarts=*/1));
    const auto verdict = client.requestRestart("a", placed.round, {"a", 0, 1, description});
    REQUIRE(verdict.action == Action::kRestart);
    CHECK_THAT(verdict.reason,
               Catch::EndsWith(std::string(100, 'd') + "... [983040 more bytes not kept]"));
    CHECK(verdict.reason.size() < kMaxFailureDescriptionBytes + 100);
  }
  // Each run keeps the description twice (the root cause, and why its round ended): 16 runs hold
  // about 2 MiB, not the 32 MiB sent.
  CHECK(server.heldBytes() <
        16 * (2 * static_cast<int64_t>(kMaxFailureDescriptionBytes) + 32 * 1024));
}

TEST_CASE("A counter that would overflow is refused over gRPC", "[server][store][limits]") {
  RendezvousServer server({});
  auto placed = soloRun(server, "job");
  GrpcStore store(clientFor(server), "job", placed.round);
  const int64_t max = std::numeric_limits<int64_t>::max();
  CHECK(store.add("n", max) == max);
  REQUIRE_THROWS_WITH(store.add("n", max), Catch::Contains("would overflow"));
  CHECK(store.add("n", 0) == max);
}

TEST_CASE("A MultiGet whose answer passes 1 MiB is served", "[server][store][limits]") {
  RendezvousServer server({});
  auto placed = soloRun(server, "job");
  GrpcStore store(clientFor(server), "job", placed.round);
  std::vector<std::string> keys;
  for (int i = 0; i < 3; ++i) {
    keys.push_back("shard" + std::to_string(i));
    store.set(keys.back(), std::string(700'000, static_cast<char>('a' + i)));
  }
  auto values = store.multiGet(keys, 1s);
  REQUIRE(values.size() == 3);
  CHECK(values[2] == std::string(700'000, 'c'));
}

TEST_CASE("A closed run's store refuses writes and is freed", "[server][store][limits]") {
  RendezvousServer server({});
  RendezvousClient client(clientFor(server), "job");
  auto placed = joinUntilPlaced(client, node("a"), settings(1, 1));
  GrpcStore store(clientFor(server), "job", placed.round);
  store.set("k", "v");
  REQUIRE(client.leave("a", placed.round).action == Action::kClosed);
  REQUIRE_THROWS_WITH(store.set("late", std::string(1 << 20, 'x')), Catch::Contains("is closed"));
  REQUIRE_THROWS_AS(store.get("k", 10ms), StaleError);
  REQUIRE_THROWS_AS(store.add("n", 1), StaleError);
  CHECK(client.status().state == "closed");  // the run itself stays for its retention time
}

TEST_CASE("Finished and abandoned runs are freed after the retention time",
          "[server][rendezvous][limits]") {
  ServerOptions options;
  options.run_retention = 300ms;
  RendezvousServer server(options);
  // A live run is kept however long it runs.
  RendezvousClient live(clientFor(server), "live");
  auto live_placed = joinUntilPlaced(live, node("b"), settings(1, 1));
  // A join of a two-node run that never completes: its node stops calling and is evicted.
  auto s = settings(2, 2);
  s.keep_alive_interval = 100ms;
  s.keep_alive_max_misses = 1;
  RendezvousClient abandoned(clientFor(server), "abandoned");
  CHECK_FALSE(abandoned.join(node("lonely"), s, 10ms).placement);
  // Last, so that the count below comes well within the retention of all three (a slow,
  // sanitized build included).
  RendezvousClient done(clientFor(server), "done");
  auto placed = joinUntilPlaced(done, node("a"), settings(1, 1));
  REQUIRE(done.leave("a", placed.round).action == Action::kClosed);
  CHECK(server.runCount() == 3);
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (server.runCount() > 1 && std::chrono::steady_clock::now() < deadline) {
    live.keepAlive("b", live_placed.round);
    std::this_thread::sleep_for(50ms);
  }
  CHECK(server.runCount() == 1);
  REQUIRE_THROWS_WITH(done.status(), Catch::Contains("no run 'done'"));
  REQUIRE_THROWS_WITH(abandoned.status(), Catch::Contains("no run 'abandoned'"));
  CHECK(live.status().state == "running");
  // A freed id may start a new run.
  auto again = joinUntilPlaced(done, node("a"), settings(1, 1));
  CHECK(again.world_size == 1);
}

TEST_CASE("Settings that would overflow are refused where they arrive", "[server][rendezvous]") {
  RendezvousServer server({});
  RendezvousClient client(clientFor(server), "job");
  auto s = settings(2, 2);
  s.keep_alive_interval = Millis(std::numeric_limits<int64_t>::max());
  REQUIRE_THROWS_WITH(client.join(node("a"), s, 10ms),
                      Catch::Contains("keep_alive_interval must be"));
  s = settings(2, 2);
  s.keep_alive_max_misses = std::numeric_limits<int>::max();
  REQUIRE_THROWS_WITH(client.join(node("a"), s, 10ms), Catch::Contains("keep_alive_max_misses"));
  s = settings(2, 2);
  s.last_call_timeout = Millis(std::numeric_limits<int64_t>::max());
  REQUIRE_THROWS_AS(client.join(node("a"), s, 10ms), InvalidArgument);
  REQUIRE_THROWS_AS(client.status(), StaleError);  // none of them created the run
}
