// Soak (ctest label "soak", not in the default preset): a rendezvous server serving tens of
// thousands of short runs keeps its memory and its latency flat, and a client filling its store
// is refused while other runs keep being served. Prints the figures docs/reliability.md quotes:
//   ctest --test-dir build -L soak --output-on-failure -V

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "common/error.h"
#include "rendezvous/client.h"
#include "rendezvous/server.h"

using namespace cxxlaunch;
using namespace cxxlaunch::rendezvous;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

long rssKiB() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

RunSettings solo() {
  RunSettings s;
  s.last_call_timeout = 0ms;
  return s;
}

NodeSpec node(const std::string& id) {
  NodeSpec n;
  n.id = id;
  n.addr = "127.0.0.1";
  n.master_port = 1234;
  return n;
}

// One short job: join, a store write and read, leave (which closes the run). Returns its time.
double oneRun(const ClientOptions& options, int i) {
  const auto start = Clock::now();
  const std::string id = "run-" + std::to_string(i);
  RendezvousClient client(options, id);
  auto poll = client.join(node("n"), solo(), 1s);
  REQUIRE(poll.placement);
  GrpcStore store(options, id, poll.placement->round);
  store.set("nccl_id", std::string(128, 'x'));
  REQUIRE(store.get("nccl_id", 1s).size() == 128);
  REQUIRE(client.leave("n", poll.placement->round).action == Action::kClosed);
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

}  // namespace

TEST_CASE("30000 short runs: memory and join latency stay flat", "[soak][limits]") {
  ServerOptions server_options;
  server_options.run_retention = 200ms;
  RendezvousServer server(server_options);
  ClientOptions options;
  options.endpoint = server.endpoint();
  options.call_timeout = 10s;
  constexpr int kRuns = 30'000, kBlock = 1'000;
  long rss_at_1000 = 0;
  double first_block_ms = 0, last_block_ms = 0;
  size_t most_runs = 0;
  for (int block = 0; block < kRuns / kBlock; ++block) {
    double total = 0;
    for (int i = 0; i < kBlock; ++i) total += oneRun(options, block * kBlock + i);
    most_runs = std::max(most_runs, server.runCount());
    if (block == 0) {
      first_block_ms = total / kBlock;
      rss_at_1000 = rssKiB();
    }
    last_block_ms = total / kBlock;
  }
  const long rss_at_end = rssKiB();
  std::cout << "soak: RSS " << rss_at_1000 << " KiB after 1,000 runs, " << rss_at_end
            << " KiB after 30,000; " << first_block_ms << " ms per run in the first 1,000, "
            << last_block_ms << " ms in the last; at most " << most_runs << " runs held\n";
  CHECK(rss_at_end <= rss_at_1000 * 11 / 10);
  CHECK(last_block_ms <= first_block_ms * 1.5 + 0.2);  // flat, with room for a noisy machine
}

TEST_CASE("20000 joins that never complete are freed", "[soak][limits]") {
  ServerOptions server_options;
  server_options.run_retention = 200ms;
  RendezvousServer server(server_options);
  ClientOptions options;
  options.endpoint = server.endpoint();
  options.call_timeout = 10s;
  RunSettings pair;
  pair.min_nodes = pair.max_nodes = 2;
  pair.keep_alive_interval = 100ms;
  pair.keep_alive_max_misses = 1;
  const long rss_before = rssKiB();
  for (int i = 0; i < 20'000; ++i) {
    RendezvousClient client(options, "abandoned-" + std::to_string(i));
    REQUIRE_FALSE(client.join(node("lonely"), pair, 0ms).placement);
  }
  const long rss_full = rssKiB();
  const auto deadline = Clock::now() + 20s;
  while (server.runCount() > 0 && Clock::now() < deadline) std::this_thread::sleep_for(50ms);
  std::cout << "soak: 20,000 abandoned joins: RSS " << rss_before << " KiB before, " << rss_full
            << " KiB right after them, " << rssKiB() << " KiB once freed; " << server.runCount()
            << " runs left\n";
  CHECK(server.runCount() == 0);
  // Freed state is reused: the next runs are as fast as ever.
  const auto start = Clock::now();
  for (int i = 0; i < 1000; ++i) oneRun(options, i);
  const double per_run =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count() / 1000;
  std::cout << "soak: " << per_run << " ms per run afterwards\n";
}

TEST_CASE("A client filling its store is refused at the limit while other runs are served",
          "[soak][limits]") {
  RendezvousServer server({});  // the defaults: 64 MiB and 100,000 keys per run
  ClientOptions options;
  options.endpoint = server.endpoint();
  options.call_timeout = 10s;
  const long rss_before = rssKiB();
  long rss_first_flood = 0;
  int other_runs = 100'000;  // ids of the runs served meanwhile
  // Twice, one run after the other: the second flood reuses what the first run's close freed.
  for (const std::string run : {"flood", "flood-again"}) {
    RendezvousClient flood_client(options, run);
    auto placed = flood_client.join(node("f"), solo(), 1s);
    REQUIRE(placed.placement);
    GrpcStore flood(options, run, placed.placement->round);
    int accepted = 0;
    std::string refusal;
    for (int i = 0; i < 1000; ++i) {  // what drove the daemon to 1 GB
      try {
        flood.set("v" + std::to_string(i), std::string(1 << 20, 'x'));
        ++accepted;
      } catch (const LimitExceeded& e) {
        refusal = e.what();
        break;
      }
      if (i % 16 == 0) oneRun(options, other_runs++);  // others are served meanwhile
    }
    const long rss = rssKiB();
    if (rss_first_flood == 0) rss_first_flood = rss;
    std::cout << "soak: " << run << ": " << accepted << " MiB accepted, then: " << refusal
              << "; RSS " << (rss - rss_before) / 1024 << " MiB above the start\n";
    CHECK(accepted == 63);
    CHECK_THAT(refusal, Catch::Contains("--store-max-bytes"));
    REQUIRE(flood_client.leave("f", placed.placement->round).action == Action::kClosed);
    REQUIRE_THROWS_AS(flood.set("after", std::string(1 << 20, 'x')), StaleError);
    oneRun(options, other_runs++);
  }
  CHECK(rssKiB() <= rss_first_flood * 11 / 10);
}

// Many runs, each within its own bounds: only the server's total stops them (16 runs of 1 MiB
// values once took cxxlaunchd to 1.06 GB, 6 runs with a 60 MiB failure description to 815 MB).
TEST_CASE("A client opening many runs is held to the server's total", "[soak][limits]") {
  ServerOptions server_options;
  server_options.max_total_bytes = 256 << 20;
  RendezvousServer server(server_options);
  ClientOptions options;
  options.endpoint = server.endpoint();
  options.call_timeout = 10s;
  const long rss_before = rssKiB();
  int accepted = 0;
  std::string refusal;
  for (int run = 0; run < 16; ++run) {
    const std::string id = "flood-" + std::to_string(run);
    RendezvousClient client(options, id);
    auto placed = client.join(node("f"), solo(), 1s);
    REQUIRE(placed.placement);
    GrpcStore store(options, id, placed.placement->round);
    for (int i = 0; i < 63; ++i) {  // each run's own bound (64 MiB) is never reached
      try {
        store.set("v" + std::to_string(i), std::string(1 << 20, 'x'));
        ++accepted;
      } catch (const LimitExceeded& e) {
        refusal = e.what();
        break;
      }
    }
  }
  const long rss_values = rssKiB();
  RunSettings restartable = solo();
  restartable.max_restarts = 1;
  for (int run = 0; run < 6; ++run) {
    RendezvousClient client(options, "failing-" + std::to_string(run));
    auto placed = client.join(node("f"), restartable, 1s);
    REQUIRE(placed.placement);
    client.requestRestart("f", placed.placement->round, {"f", 0, 1, std::string(60 << 20, 'd')});
  }
  const long rss_end = rssKiB();
  std::cout << "soak: 16 runs of 1 MiB values under a 256 MiB total: " << accepted
            << " MiB accepted, then: " << refusal << "; RSS " << (rss_values - rss_before) / 1024
            << " MiB above the start; after 6 runs with a 60 MiB failure description: "
            << (rss_end - rss_before) / 1024 << " MiB; held " << server.heldBytes() / 1024
            << " KiB\n";
  CHECK(accepted < 256);
  CHECK_THAT(refusal, Catch::Contains("--store-max-total-bytes"));
  CHECK(server.heldBytes() <= server_options.max_total_bytes);
  CHECK(rss_end - rss_before < (256 + 128) * 1024);  // the total, and room for gRPC's buffers
}
