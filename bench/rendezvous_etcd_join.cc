// Rendezvous through etcd at scale: N simulated nodes in this process join one round through a
// real etcd on loopback, each running the launcher's own etcd backend
// (rendezvous::EtcdRendezvous: its lease, its alive key, its join key, the compare-and-swap that
// completes the round, its watch); then the same N join one round through a real cxxlaunchd, each
// running the launcher's own client of it (rendezvous::RendezvousClient). One thread per node in
// both, as one launcher per node has; the nodes share `--connections` TCP connections to each
// server.
//
// For each N it prints the time from the first node's start to the last placement, for etcd and
// for cxxlaunchd, and their ratio; and, from etcd's own /metrics over the etcd round, what etcd
// did per node: transactions, watch streams opened, watch events sent, bytes sent, WAL fsyncs,
// etcd's CPU time. No target (issue 35 asks for the ratio at 4,096 nodes): etcd buys a
// replicated coordinator, and this says what it costs at scale.
//
// usage: rendezvous_etcd_join_bench [--daemon build/bin/cxxlaunchd] [--etcd etcd]
//                                   [--nodes 64,256,1024] [--connections 16] [--repeat 1]
//                                   [--limit 600]
// Each figure is the median of --repeat rounds (a fresh run id each). An etcd round still
// unplaced after --limit seconds is cancelled and reported as such, with how many nodes were
// placed and how many its state held once every join had stopped (the larger N are then skipped
// for etcd; cxxlaunchd still runs them). Exits non-zero if any node got a wrong or missing
// placement, or an error.

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_process.h"
#include "common/command_line.h"
#include "common/error.h"
#include "rendezvous/client.h"
#include "rendezvous/etcd_client.h"
#include "rendezvous/etcd_rendezvous.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace rdzv = cxxlaunch::rendezvous;

int freePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    throw std::runtime_error("no free port");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

using cxxlaunch::bench::cpuSeconds;
using cxxlaunch::bench::Daemon;
using cxxlaunch::bench::spawn;
using cxxlaunch::bench::stop;

// One etcd member (Debian's etcd-server), data in a temporary folder on the local disk, every
// write fsynced as etcd does. It listens on `ports` client ports, so that each of the bench's
// connections is a TCP connection of its own (gRPC shares one among channels to one address).
struct Etcd {
  pid_t pid = -1;
  std::filesystem::path folder;
  std::vector<std::string> endpoints;

  Etcd(const std::string& path, int ports) {
    char tmpl[] = "/tmp/rdzv-etcd-bench-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp");
    folder = tmpl;
    std::string urls;
    for (int i = 0; i < ports; ++i) {
      endpoints.push_back("127.0.0.1:" + std::to_string(freePort()));
      urls += (i ? ",http://" : "http://") + endpoints.back();
    }
    const std::string peer = "http://127.0.0.1:" + std::to_string(freePort());
    // Its log (gRPC's reconnection chatter among its own listeners included) in its folder.
    const int log_fd = ::open((folder / "etcd.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid = spawn(
        {path, "--name", "bench", "--data-dir", (folder / "data").string(), "--listen-client-urls",
         urls, "--advertise-client-urls", "http://" + endpoints.front(), "--listen-peer-urls", peer,
         "--initial-advertise-peer-urls", peer, "--initial-cluster", "bench=" + peer,
         // Room for the runs of every N (each state write keeps a revision).
         "--quota-backend-bytes", std::to_string(8LL << 30), "--log-level", "error", "--logger",
         "zap"},
        log_fd, log_fd);
    ::close(log_fd);
    rdzv::EtcdOptions options;
    options.endpoints = {endpoints.front()};
    options.call_timeout = std::chrono::seconds(1);
    rdzv::EtcdClient client(options);
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    for (;;) {
      try {
        client.run(rdzv::EtcdOp::get("/health"));
        return;
      } catch (const cxxlaunch::Error&) {
        if (Clock::now() > deadline) throw std::runtime_error("etcd did not come up");
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  }
  ~Etcd() {
    stop(pid);
    std::error_code ignored;
    std::filesystem::remove_all(folder, ignored);
  }

  // etcd's /metrics (Prometheus text), unlabelled counters and the labelled ones summed by
  // name + labels as written.
  std::map<std::string, double> metrics() const {
    const auto colon = endpoints.front().rfind(':');
    const int port = std::stoi(endpoints.front().substr(colon + 1));
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    std::map<std::string, double> out;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::close(fd);
      return out;
    }
    const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
      ::close(fd);
      return out;
    }
    std::string text;
    char buf[65536];
    for (ssize_t got; (got = ::read(fd, buf, sizeof(buf))) > 0;) text.append(buf, size_t(got));
    ::close(fd);
    std::istringstream lines(text);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.empty() || line[0] == '#') continue;
      const auto space = line.rfind(' ');
      if (space == std::string::npos) continue;
      try {
        out[line.substr(0, space)] = std::stod(line.substr(space + 1));
      } catch (const std::exception&) {
      }
    }
    return out;
  }
};

// What etcd did during one round, from two readings of its /metrics.
struct EtcdWork {
  double txns = 0, watches = 0, events = 0, puts = 0, sent_mib = 0, fsyncs = 0, fsync_s = 0,
         cpu_s = 0;
};

EtcdWork difference(const std::map<std::string, double>& a, const std::map<std::string, double>& b,
                    double cpu_s) {
  auto get = [](const std::map<std::string, double>& m, const std::string& key) {
    auto it = m.find(key);
    return it == m.end() ? 0.0 : it->second;
  };
  auto delta = [&](const std::string& key) { return get(b, key) - get(a, key); };
  const std::string started = "grpc_server_started_total{grpc_method=\"";
  EtcdWork w;
  w.txns = delta(started + "Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"}");
  w.watches =
      delta(started + "Watch\",grpc_service=\"etcdserverpb.Watch\",grpc_type=\"bidi_stream\"}");
  w.events = delta("etcd_debugging_mvcc_events_total");
  w.puts = delta("etcd_mvcc_put_total");
  w.sent_mib = delta("etcd_network_client_grpc_sent_bytes_total") / (1 << 20);
  w.fsyncs = delta("etcd_disk_wal_fsync_duration_seconds_count");
  w.fsync_s = delta("etcd_disk_wal_fsync_duration_seconds_sum");
  w.cpu_s = cpu_s;
  return w;
}

rdzv::RunSettings settingsFor(int n) {
  rdzv::RunSettings s;
  s.min_nodes = n;
  s.max_nodes = n;
  s.last_call_timeout = std::chrono::seconds(30);
  s.keep_alive_interval = std::chrono::seconds(30);
  s.keep_alive_max_misses = 3;
  return s;
}

// The launcher's call timeout for these settings (launcher/node_rendezvous.cc).
constexpr std::chrono::milliseconds kCallTimeout = std::chrono::seconds(10);

struct Round {
  double ms = 0;         // first start to last placement
  double client_s = 0;   // this process's CPU time over the round
  int placed = 0;        // nodes placed
  bool ok = true;        // every node placed once, in one world of n
  bool finished = true;  // false: cancelled at the limit
  std::string error;     // the first error a node met
};

// A node: join polls as the launcher's (launcher/node_rendezvous.cc: RemoteRendezvous::join)
// until placed or cancelled.
template <typename Join>
void runNode(Join&& join, const rdzv::NodeSpec& node, const rdzv::RunSettings& settings,
             const std::atomic<bool>& cancelled, std::optional<rdzv::Placement>& placement,
             std::string& error) {
  while (!cancelled) {
    try {
      auto poll = join(node, settings, settings.keep_alive_interval);
      if (poll.placement) {
        placement = poll.placement;
        return;
      }
    } catch (const cxxlaunch::TimeoutError& e) {
      error = e.what();  // retried, as the launcher does
    } catch (const cxxlaunch::CommunicationError& e) {
      if (cancelled) return;
      error = e.what();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    } catch (const std::exception& e) {
      error = e.what();
      return;
    }
  }
}

// Runs `n` nodes; `make(i)` gives node i's join function and `cancel(i)` ends its join. Returns
// once every node is placed or `limit` has passed (then every join is cancelled).
template <typename Make, typename Cancel>
Round runRound(int n, Make&& make, Cancel&& cancel, std::chrono::seconds limit) {
  const rdzv::RunSettings settings = settingsFor(n);
  std::vector<std::optional<rdzv::Placement>> placements(static_cast<size_t>(n));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::atomic<bool> cancelled = false;
  std::mutex mu;
  std::condition_variable changed;
  int done = 0;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  const double cpu_start = cpuSeconds(::getpid());
  const auto start = Clock::now();
  auto last = start;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      char id[32];
      std::snprintf(id, sizeof(id), "node%05d", i);
      rdzv::NodeSpec node;
      node.id = id;
      node.addr = "127.0.0.1";
      auto join = make(i);
      runNode(join, node, settings, cancelled, placements[static_cast<size_t>(i)],
              errors[static_cast<size_t>(i)]);
      std::lock_guard<std::mutex> lock(mu);
      last = Clock::now();
      if (++done == n) changed.notify_all();
    });
  }
  Round r;
  {
    std::unique_lock<std::mutex> lock(mu);
    if (!changed.wait_for(lock, limit, [&] { return done == n; })) {
      r.finished = false;
      cancelled = true;
      lock.unlock();
      for (int i = 0; i < n; ++i) cancel(i);
    }
  }
  for (auto& t : threads) t.join();
  r.ms =
      std::chrono::duration<double, std::milli>((r.finished ? last : Clock::now()) - start).count();
  r.client_s = cpuSeconds(::getpid()) - cpu_start;
  long long rank_sum = 0;
  for (int i = 0; i < n; ++i) {
    const auto& p = placements[static_cast<size_t>(i)];
    if (!p) {
      r.ok = false;
      if (r.error.empty()) r.error = errors[static_cast<size_t>(i)];
      continue;
    }
    ++r.placed;
    rank_sum += p->node_rank;
    if (p->world_size != n || p->num_nodes != n) r.ok = false;
  }
  r.ok = r.ok && r.placed == n && rank_sum == static_cast<long long>(n) * (n - 1) / 2;
  return r;
}

struct EtcdRound {
  Round round;
  EtcdWork work;
  int joined = 0;  // of a cancelled round: the nodes its state had joined by then
};

EtcdRound etcdRound(const Etcd& etcd, int n, int connections, const std::string& run_id,
                    std::chrono::seconds limit) {
  std::vector<std::shared_ptr<rdzv::EtcdClient>> clients;
  for (int c = 0; c < connections; ++c) {
    rdzv::EtcdOptions options;
    options.endpoints = {etcd.endpoints[static_cast<size_t>(c) % etcd.endpoints.size()]};
    options.call_timeout = kCallTimeout;
    clients.push_back(std::make_shared<rdzv::EtcdClient>(options));
  }
  std::vector<std::unique_ptr<rdzv::EtcdRendezvous>> nodes;
  for (int i = 0; i < n; ++i) {
    nodes.push_back(std::make_unique<rdzv::EtcdRendezvous>(
        clients[static_cast<size_t>(i % connections)], run_id));
  }
  const auto before = etcd.metrics();
  const double cpu_before = cpuSeconds(etcd.pid);
  EtcdRound out;
  out.round = runRound(
      n,
      [&](int i) {
        return [&, i](const rdzv::NodeSpec& node, const rdzv::RunSettings& s, rdzv::Millis poll) {
          return nodes[static_cast<size_t>(i)]->join(node, s, poll);
        };
      },
      [&](int i) { nodes[static_cast<size_t>(i)]->cancel(); }, limit);
  out.work = difference(before, etcd.metrics(), cpuSeconds(etcd.pid) - cpu_before);
  if (!out.round.finished) {
    try {
      out.joined = static_cast<int>(nodes.front()->status().participants.size());
    } catch (const cxxlaunch::Error&) {
    }
  }
  // Each node's close() revokes its lease (the alive key goes): not timed.
  std::vector<std::thread> closers;
  const int k = std::min(n, 64);
  for (int t = 0; t < k; ++t) {
    closers.emplace_back([&, t] {
      for (int i = t; i < n; i += k) {
        try {
          nodes[static_cast<size_t>(i)]->close();
        } catch (const cxxlaunch::Error&) {
        }
      }
    });
  }
  for (auto& t : closers) t.join();
  return out;
}

Round daemonRound(const Daemon& daemon, int n, int connections, const std::string& run_id) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int c = 0; c < connections; ++c) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(256 << 20);      // as rendezvous::makeChannel
    args.SetInt("cxxlaunch.bench.connection", c);  // distinct args: distinct connections
    channels.push_back(
        grpc::CreateCustomChannel(daemon.endpoint, grpc::InsecureChannelCredentials(), args));
  }
  rdzv::ClientOptions options;
  options.endpoint = daemon.endpoint;
  options.call_timeout = kCallTimeout;
  std::vector<std::unique_ptr<rdzv::RendezvousClient>> nodes;
  for (int i = 0; i < n; ++i) {
    nodes.push_back(std::make_unique<rdzv::RendezvousClient>(
        options, run_id, channels[static_cast<size_t>(i % connections)]));
  }
  return runRound(
      n,
      [&](int i) {
        return [&, i](const rdzv::NodeSpec& node, const rdzv::RunSettings& s, rdzv::Millis poll) {
          return nodes[static_cast<size_t>(i)]->join(node, s, poll);
        };
      },
      [&](int i) { nodes[static_cast<size_t>(i)]->cancel(); }, std::chrono::seconds(600));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string daemon_path = "build/bin/cxxlaunchd";
  std::string etcd_path = "etcd";
  std::vector<int> sizes = {64, 256, 1024};
  int connections = 16;
  int repeat = 1;
  int limit_s = 600;
  CLI::App app(
      "One rendezvous round of N simulated nodes through etcd against the same through "
      "cxxlaunchd.",
      "rendezvous_etcd_join_bench");
  cxxlaunch::cli::useConventions(app);
  app.add_option(cxxlaunch::cli::spellings("daemon"), daemon_path, "the cxxlaunchd binary")
      ->capture_default_str();
  app.add_option(cxxlaunch::cli::spellings("etcd"), etcd_path, "the etcd binary")
      ->capture_default_str();
  app.add_option(cxxlaunch::cli::spellings("repeat"), repeat, "rounds per size; medians printed")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option(cxxlaunch::cli::spellings("connections"), connections,
                 "TCP connections to each server, shared by the nodes")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option(cxxlaunch::cli::spellings("limit"), limit_s,
                 "seconds an etcd round may take before it is cancelled")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  app.add_option(cxxlaunch::cli::spellings("nodes"), sizes, "node counts, e.g. 64,256")
      ->delimiter(',')
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->check(CLI::Range(1, 1 << 16));
  cxxlaunch::cli::parseOrExit(app, argc, argv);
  // Two threads per simulated node (its join, its etcd lease's keep-alive): small stacks, so
  // that thousands fit (their calls keep their data on the heap).
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 << 10);
  pthread_setattr_default_np(&attr);

  Etcd etcd(etcd_path, connections);
  Daemon daemon(daemon_path);
  std::printf("%6s %10s %10s %8s %9s %9s %10s %10s %10s %9s %9s %9s\n", "nodes", "etcd ms",
              "daemon ms", "ratio", "txn/node", "watch/nd", "events/nd", "KiB out/nd", "fsync/node",
              "etcd CPU", "bench CPU", "placed");
  bool ok = true;
  bool etcd_gave_up = false;
  for (int n : sizes) {
    std::vector<double> etcd_ms, daemon_ms;
    EtcdRound last;
    bool this_ok = true;
    const bool skipped = etcd_gave_up;
    for (int k = 0; k < repeat && !etcd_gave_up; ++k) {
      const std::string suffix = std::to_string(n) + "-" + std::to_string(k);
      last = etcdRound(etcd, n, connections, "etcd-" + suffix, std::chrono::seconds(limit_s));
      if (!last.round.finished) {
        etcd_gave_up = true;
        break;
      }
      etcd_ms.push_back(last.round.ms);
      this_ok = this_ok && last.round.ok;
      if (!last.round.ok) std::fprintf(stderr, "etcd, %d nodes: %s\n", n, last.round.error.c_str());
    }
    for (int k = 0; k < repeat; ++k) {
      Round d = daemonRound(daemon, n, connections,
                            "daemon-" + std::to_string(n) + "-" + std::to_string(k));
      daemon_ms.push_back(d.ms);
      this_ok = this_ok && d.ok;
      if (!d.ok) std::fprintf(stderr, "cxxlaunchd, %d nodes: %s\n", n, d.error.c_str());
    }
    const double dm = median(daemon_ms);
    const auto& w = last.work;
    if (skipped) {
      std::printf("%6d %10s %10.1f  etcd skipped (a smaller N passed the limit)\n", n, "-", dm);
    } else if (etcd_ms.empty()) {
      std::printf(
          "%6d %10s %10.1f %8s %9.1f %9.1f %10.1f %10.1f %10.2f %8.1fs %8.1fs %5d/%d  "
          "etcd CANCELLED after %d s, %d nodes joined\n",
          n, "-", dm, "-", w.txns / n, w.watches / n, w.events / n, w.sent_mib * 1024 / n,
          w.fsyncs / n, w.cpu_s, last.round.client_s, last.round.placed, n, limit_s, last.joined);
    } else {
      const double em = median(etcd_ms);
      std::printf(
          "%6d %10.1f %10.1f %8.2f %9.1f %9.1f %10.1f %10.1f %10.2f %8.1fs %8.1fs %5d/%d%s\n", n,
          em, dm, em / dm, w.txns / n, w.watches / n, w.events / n, w.sent_mib * 1024 / n,
          w.fsyncs / n, w.cpu_s, last.round.client_s, last.round.placed, n,
          this_ok ? "" : "  WRONG PLACEMENTS");
    }
    std::fflush(stdout);
    ok = ok && this_ok;
  }
  std::printf(
      "etcd's work over the last etcd round of each N, per node: transactions, watch "
      "streams opened, watch events sent, bytes sent, WAL fsyncs; etcd CPU and bench "
      "CPU: seconds over that round\n");
  return ok ? 0 : 1;
}
