// Rendezvous scale: N simulated nodes join one round on one cxxlaunchd over loopback.
//
// For each N it prints the time from the first Join sent to the last placement received, the
// cost per node (that time / N), and the ratio to N sequential unary round trips (KeepAlive) on
// the same server, measured in the same run; the daemon's peak resident memory so far; and the
// limit: the same round against rendezvous_floor_server (bench/rendezvous_floor.cc), a server
// that only counts the calls, on the same gRPC, in the same run.
// Targets (issue 35): 65,536 nodes within 10 s, and the cost per node flat in N: at most 1.2x
// from the first N to any larger one.
//
// usage: rendezvous_join_bench [--daemon build/bin/cxxlaunchd] [--nodes 1024,4096,65536]
//                              [--connections 16] [--repeat 5]
//                              [--floor build/bin/rendezvous_floor_server | --floor '']
// Each figure is the median of --repeat runs (a fresh run id each).
// The nodes share `--connections` TCP connections (a real job has one per node; the file
// descriptor limit of a test machine does not allow 65,536). Thousands of streams on one
// connection cost gRPC more per call than the same calls spread out (at 16,384 nodes: 372 us per
// node over 16 connections, 235 us over 256), so the default is 256. Exits non-zero if any node got
// a wrong or missing placement.

#include <absl/synchronization/mutex.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_process.h"
#include "common/command_line.h"
#include "proto/rendezvous.grpc.pb.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace rdzv = cxxlaunch::rdzv;

using cxxlaunch::bench::Daemon;

struct Result {
  double join_ms = 0;
  double daemon_cpu_ms = 0;  // the daemon's CPU time during the join
  double sequential_ms = 0;
  bool ok = true;
};

// `with_peer`: also time the N sequential round trips (the peer), after the round.
Result measure(const Daemon& daemon, int n, int connections, const std::string& run_id,
               bool with_peer = true) {
  const std::string& endpoint = daemon.endpoint;
  std::vector<std::unique_ptr<rdzv::Rendezvous::Stub>> stubs;
  for (int c = 0; c < connections; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("cxxlaunch.bench.connection", c);  // distinct args: distinct connections
    auto channel = grpc::CreateCustomChannel(endpoint, grpc::InsecureChannelCredentials(), args);
    channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10));
    stubs.push_back(rdzv::Rendezvous::NewStub(channel));
  }
  rdzv::RunSettings settings;
  settings.set_min_nodes(n);
  settings.set_max_nodes(n);
  settings.set_last_call_timeout_ms(30000);
  settings.set_keep_alive_interval_ms(30000);
  settings.set_keep_alive_max_misses(3);

  struct Call {
    grpc::ClientContext ctx;
    rdzv::JoinRequest req;
    rdzv::JoinResponse resp;
  };
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < n; ++i) {
    auto call = std::make_unique<Call>();
    call->req.set_run_id(run_id);
    char id[32];
    std::snprintf(id, sizeof(id), "node%05d", i);
    call->req.mutable_node()->set_id(id);
    call->req.mutable_node()->set_addr("127.0.0.1");
    call->req.mutable_node()->set_local_world_size(1);
    call->req.mutable_node()->set_node_rank(-1);
    *call->req.mutable_settings() = settings;
    call->req.set_poll_ms(30000);
    call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    calls.push_back(std::move(call));
  }
  std::mutex mu;
  std::condition_variable done;
  int finished = 0;
  std::atomic<bool> all_ok = true;
  const double cpu_start = 1000 * cxxlaunch::bench::cpuSeconds(daemon.pid);
  const auto start = Clock::now();
  for (int i = 0; i < n; ++i) {
    Call& call = *calls[static_cast<size_t>(i)];
    stubs[static_cast<size_t>(i % connections)]->async()->Join(
        &call.ctx, &call.req, &call.resp, [&](grpc::Status status) {
          if (!status.ok() || !call.resp.complete()) all_ok = false;
          std::lock_guard<std::mutex> lock(mu);
          if (++finished == n) done.notify_all();
        });
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    done.wait(lock, [&] { return finished == n; });
  }
  Result result;
  result.join_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  result.daemon_cpu_ms = 1000 * cxxlaunch::bench::cpuSeconds(daemon.pid) - cpu_start;
  // Every node placed once: node ranks 0..n-1, all in one world of n.
  long long rank_sum = 0;
  for (const auto& call : calls) {
    rank_sum += call->resp.round().node_rank();
    if (call->resp.round().world_size() != n) all_ok = false;
  }
  result.ok = all_ok && rank_sum == static_cast<long long>(n) * (n - 1) / 2;
  if (!with_peer) return result;

  // The peer: n sequential unary round trips on the same server.
  const auto seq_start = Clock::now();
  for (int i = 0; i < n; ++i) {
    grpc::ClientContext ctx;
    rdzv::KeepAliveRequest req;
    req.set_run_id(run_id);
    req.set_node_id(calls[static_cast<size_t>(i)]->req.node().id());
    req.set_round(calls[0]->resp.round().round());
    rdzv::KeepAliveResponse resp;
    if (!stubs[0]->KeepAlive(&ctx, req, &resp).ok()) result.ok = false;
  }
  result.sequential_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - seq_start).count();
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  std::string daemon_path = "build/bin/cxxlaunchd";
  std::string floor_path = "build/bin/rendezvous_floor_server";
  std::vector<int> sizes = {1024, 4096, 16384};
  int connections = 256;
  int repeat = 5;
  CLI::App app(
      "Rendezvous join time at N nodes against N sequential round trips to the same daemon.",
      "rendezvous_join_bench");
  cxxlaunch::cli::useConventions(app);
  app.add_option(cxxlaunch::cli::spellings("daemon"), daemon_path, "the cxxlaunchd binary")
      ->capture_default_str();
  app.add_option(cxxlaunch::cli::spellings("floor"), floor_path,
                 "the do-nothing server measured as the limit; empty: none")
      ->capture_default_str();
  app.add_option(cxxlaunch::cli::spellings("repeat"), repeat, "runs per size; medians printed")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option(cxxlaunch::cli::spellings("connections"), connections, "gRPC channels")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option(cxxlaunch::cli::spellings("nodes"), sizes, "node counts, e.g. 64,256")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->check(CLI::Range(1, 1 << 20));
  cxxlaunch::cli::parseOrExit(app, argc, argv);
  // As the daemon does (rendezvous/server.cc): Debian's abseil runs its deadlock detector on
  // every lock otherwise, at a cost that grows with the calls open.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  Daemon daemon(daemon_path);
  std::unique_ptr<Daemon> floor;
  if (!floor_path.empty()) floor = std::make_unique<Daemon>(floor_path);
  std::printf("%8s %16s %9s %16s %22s %9s %8s %14s %9s %11s\n", "nodes", "join-complete ms",
              "us/node", "daemon CPU us/node", "N sequential RTTs ms", "us/RTT", "ratio",
              "daemon peak MiB", "floor ms", "ours/floor");
  bool ok = true;
  double first_ratio = 0, last_ratio = 0;
  double first_per_node = 0, worst_growth = 0, largest_ms = 0;
  int largest = 0;
  for (int n : sizes) {
    measure(daemon, std::min(n, 8), connections, "warm-" + std::to_string(n));
    if (floor) measure(*floor, std::min(n, 8), connections, "warm-" + std::to_string(n), false);
    std::vector<double> joins, sequentials, cpus, floors;
    Result r;
    for (int k = 0; k < repeat; ++k) {  // interleaved, so that machine noise hits both alike
      const std::string run_id = "bench-" + std::to_string(n) + "-" + std::to_string(k);
      Result one = measure(daemon, n, connections, run_id);
      joins.push_back(one.join_ms);
      sequentials.push_back(one.sequential_ms);
      cpus.push_back(one.daemon_cpu_ms);
      r.ok = r.ok && one.ok;
      if (floor) {
        const Result limit = measure(*floor, n, connections, run_id, /*with_peer=*/false);
        floors.push_back(limit.join_ms);
        r.ok = r.ok && limit.ok;
      }
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    r.join_ms = median(joins);
    r.sequential_ms = median(sequentials);
    r.daemon_cpu_ms = median(cpus);
    const double floor_ms = floors.empty() ? 0 : median(floors);
    const double ratio = r.join_ms / r.sequential_ms;
    const double per_node_us = r.join_ms * 1000 / n;
    if (first_ratio == 0) first_ratio = ratio;
    last_ratio = ratio;
    if (first_per_node == 0) first_per_node = per_node_us;
    worst_growth = std::max(worst_growth, per_node_us / first_per_node);
    if (n >= largest) largest = n, largest_ms = r.join_ms;
    std::printf("%8d %16.1f %9.1f %16.1f %22.1f %9.1f %8.2f %14.0f %9.1f %11.2f%s\n", n, r.join_ms,
                per_node_us, r.daemon_cpu_ms * 1000 / n, r.sequential_ms,
                r.sequential_ms * 1000 / n, ratio, cxxlaunch::bench::peakResidentMiB(daemon.pid),
                floor_ms, floor_ms > 0 ? r.join_ms / floor_ms : 0.0,
                r.ok ? "" : "  WRONG PLACEMENTS");
    std::fflush(stdout);
    ok = ok && r.ok;
  }
  std::printf("cost per node: at most %.2fx the first N's (target <= 1.2: %s)\n", worst_growth,
              worst_growth <= 1.2 ? "met" : "MISSED");
  std::printf("join/RTT ratio: first N %.2f, last N %.2f\n", first_ratio, last_ratio);
  if (largest >= 65536) {
    std::printf("%d nodes: %.1f s (target <= 10 s: %s)\n", largest, largest_ms / 1000,
                largest_ms <= 10000 ? "met" : "MISSED");
  }
  if (floor) {
    std::printf("floor: the same rounds against %s, which only counts the calls\n",
                floor_path.c_str());
  }
  return ok ? 0 : 1;
}
