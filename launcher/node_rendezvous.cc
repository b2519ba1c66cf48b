#include "launcher/node_rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <iostream>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "common/heartbeat_record.h"
#include "common/host.h"
#include "launcher/process.h"
#include "launcher/rendezvous_link.h"
#include "rendezvous/client.h"
#include "rendezvous/daemon_flags.h"
#include "rendezvous/etcd_client.h"
#include "rendezvous/etcd_rendezvous.h"
#include "rendezvous/server.h"

namespace cxxlaunch::launcher {
namespace rdzv = cxxlaunch::rendezvous;
namespace {

using Clock = std::chrono::steady_clock;

// A port that was free a moment ago; the OS picks it.
int reserveFreePort() {
  int fd = CXXLAUNCH_SYSCALL(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int err = errno;
    ::close(fd);
    throw SystemError("reserve a free port", err);
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

// `endpoint` was checked when the flag was parsed (launcher/cli): it has a valid port.
HostPort splitEndpoint(const std::string& endpoint) {
  const auto parsed = parseHostPort(endpoint, 0);
  if (!parsed) throw InvalidArgument("'" + endpoint + "' is not HOST:PORT");
  return *parsed;
}

// The address of this machine that traffic to `host` leaves from: what other nodes can reach
// us at. Nothing is sent (a UDP connect only picks a route).
std::string localAddressToward(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || found == nullptr) return "127.0.0.1";
  std::string result = "127.0.0.1";
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd != -1 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    char text[INET_ADDRSTRLEN] = {};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text)) != nullptr) {
      result = text;
    }
  }
  if (fd != -1) ::close(fd);
  ::freeaddrinfo(found);
  // On the node that hosts the rendezvous, its own name often resolves to a loopback address
  // (Debian's 127.0.1.1 line, many container images) that the other nodes cannot reach it at.
  if (isLoopbackAddress(result) && host != "localhost" && !isLoopbackAddress(host)) {
    if (std::string other = firstNonLoopbackAddress(); !other.empty()) result = other;
  }
  return result;
}

// `self`: this node's id; a root cause of its own is reported from its own failure table.
Decision decisionOf(const rdzv::Verdict& verdict, const std::string& self) {
  Decision d;
  d.reason = verdict.reason;
  switch (verdict.action) {
    case rdzv::Action::kRestart:
      d.kind = Decision::Kind::kRestart;
      break;
    case rdzv::Action::kFail:
      d.kind = Decision::Kind::kFail;
      if (verdict.root_cause) {
        d.remote_exit_code = verdict.root_cause->exit_code;
        if (verdict.root_cause->node_id != self) {
          d.remote_description =
              verdict.root_cause->description + " on node " + verdict.root_cause->node_id;
        }
      }
      break;
    case rdzv::Action::kClosed:
      d.kind = Decision::Kind::kDone;
      break;
    case rdzv::Action::kContinue:
      d.kind = Decision::Kind::kWait;
      break;
  }
  return d;
}

// How each worker is doing now, for the keep-alive that reports it: its state from /proc, the
// time since its heartbeat file was last touched (none when it never beat: no runtime, or not
// there yet) and the progress record the file holds, if any.
std::vector<rdzv::WorkerProgress> progressOf(const std::vector<LocalWorker>& workers) {
  std::vector<rdzv::WorkerProgress> out;
  out.reserve(workers.size());
  const auto now = std::chrono::system_clock::now();
  for (const auto& w : workers) {
    rdzv::WorkerProgress p;
    p.local_rank = w.local_rank;
    p.rank = w.global_rank;
    p.pid = w.pid;
    p.state = w.running ? processState(w.pid) : "exited";
    struct stat st {};
    if (!w.heartbeat_file.empty() && ::stat(w.heartbeat_file.c_str(), &st) == 0) {
      const auto beat = std::chrono::system_clock::time_point(
          std::chrono::duration_cast<std::chrono::system_clock::duration>(
              std::chrono::seconds(st.st_mtim.tv_sec) +
              std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
      p.progress_age =
          std::max(rdzv::Millis(0), std::chrono::duration_cast<rdzv::Millis>(now - beat));
    }
    if (auto record =
            w.heartbeat_file.empty() ? std::nullopt : readHeartbeatRecord(w.heartbeat_file)) {
      p.steps = record->steps;
      p.step_us = record->step_us;
      p.work_us = record->work_us;
    }
    out.push_back(std::move(p));
  }
  return out;
}

// Every job goes through a rendezvous server, a single-node job too: it hosts a private one on
// loopback, so that its workers get a store (for Gloo and NCCL bootstrap) like any other job.
// The launcher that hosts the server joins it directly (HostedLink); the others over gRPC.

class RemoteRendezvous final : public NodeRendezvous {
 public:
  explicit RemoteRendezvous(const LaunchOptions& options) : options_(options.rdzv) {
    const auto& r = options.rdzv;
    std::string endpoint = r.endpoint;
    std::shared_ptr<rdzv::EtcdClient> etcd;
    if (r.etcd()) {
      rdzv::EtcdOptions eo = etcdOptionsOf(r);
      eo.call_timeout =
          std::clamp<std::chrono::milliseconds>(r.keep_alive_interval * r.keep_alive_max_misses,
                                                std::chrono::seconds(1), std::chrono::seconds(10));
      etcd = std::make_shared<rdzv::EtcdClient>(eo);
      // Workers reach the same members (runtime/world.cc: an etcd:// endpoint is an EtcdStore).
      // (With the default root the URL names none, and the workers take /cxxlaunch/.)
      endpoint = rdzv::etcdEndpointUrl(eo.endpoints, r.etcd_root);
      store_user_ = r.etcd_user;
    } else if (r.is_host.value_or(true)) {
      host(endpoint, options);
    }
    if (endpoint.empty()) endpoint = server_->endpoint();
    client_options_.endpoint = endpoint;
    client_options_.token = r.etcd() ? r.etcd_password : r.token;
    client_options_.tls_ca_file = r.tls_ca;
    client_options_.tls_cert_file = r.tls_cert;
    client_options_.tls_key_file = r.tls_key;
    // No call of ours needs to wait longer than the server waits before it evicts us: past that
    // the answer no longer matters, and a stopped or partitioned server must cost each call at
    // most that (and a join poll at most that beyond its poll time), not a fixed 10 s.
    client_options_.call_timeout =
        std::clamp<std::chrono::milliseconds>(r.keep_alive_interval * r.keep_alive_max_misses,
                                              std::chrono::seconds(1), std::chrono::seconds(10));
    run_id_ = options.run_id;
    // The hosting launcher calls its own server directly.
    if (etcd) {
      link_ = etcdLink(etcd, run_id_, etcdKeyRoot(r));
    } else if (server_) {
      link_ = hostedLink(*server_, run_id_);
    } else {
      link_ = grpcLink(client_options_, run_id_);
    }

    const std::string toward = etcd
                                   ? splitEndpoint(etcd->options().endpoints.front()).host
                                   : (r.multiNode() ? splitEndpoint(endpoint).host : std::string());
    node_.addr = !r.local_addr.empty() ? r.local_addr
                 : !r.multiNode()      ? options.master_addr
                                       : localAddressToward(toward);
    node_.id = node_.addr + "_" + std::to_string(::getpid()) + "_" + randomHex(6);
    node_.local_world_size = options.nproc_per_node;
    node_.master_port = options.master_port != 0 ? options.master_port : reserveFreePort();
    node_.node_rank = r.backend == "static" ? std::max(r.node_rank, 0) : -1;
    settings_.min_nodes = r.min_nodes;
    settings_.max_nodes = r.max_nodes;
    settings_.last_call_timeout = r.last_call_timeout;
    settings_.keep_alive_interval = r.keep_alive_interval;
    settings_.keep_alive_max_misses = r.keep_alive_max_misses;
    settings_.max_restarts = options.max_restarts;
  }

  ~RemoteRendezvous() override {
    unwatch();
    link_->close();
  }

  // 1. Poll Join until the round is complete or join_timeout passes; each poll is also this
  //    node's keep-alive while it waits.
  // 2. An unreachable server is retried until the deadline (nodes may start before it).
  // 3. On timeout, say who joined and who is missing.
  WorldAssignment join() override {
    const auto deadline = Clock::now() + options_.join_timeout;
    std::string last_news = "no answer from the server yet";
    while (Clock::now() < deadline) {
      const auto left = std::chrono::duration_cast<rdzv::Millis>(deadline - Clock::now());
      try {
        auto poll = link_->join(node_, settings_, std::min(left, options_.keep_alive_interval));
        if (poll.placement) return assignmentOf(*poll.placement);
        last_news = poll.waiting_for;
      } catch (const TimeoutError& e) {
        last_news = std::string("could not reach the server: ") + e.what();
      } catch (const CommunicationError& e) {
        if (cancelled_) throw;
        last_news = std::string("could not reach the server: ") + e.what();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
    throw TimeoutError("rendezvous '" + run_id_ + "' at " + client_options_.endpoint +
                       " did not complete within " +
                       std::to_string(options_.join_timeout.count() / 1000) + " s: " + last_news);
  }

  void cancelJoin() override {
    cancelled_ = true;
    link_->cancel();
  }

  // One poll that does not wait, on the server this launcher hosts: a round that this join
  // completes (a single-node job's) needs no thread to wait on.
  std::optional<WorldAssignment> joinAtOnce() override {
    if (!server_) return std::nullopt;
    auto poll = link_->join(node_, settings_, rdzv::Millis(0));
    if (!poll.placement) return std::nullopt;
    return assignmentOf(*poll.placement);
  }

  void watch(std::function<void()> news) override {
    unwatch();
    stop_ = false;
    watcher_ = std::thread([this, news = std::move(news)] { keepAliveLoop(news); });
  }

  void unwatch() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    if (watcher_.joinable()) watcher_.join();
  }

  Decision news() override {
    std::lock_guard<std::mutex> lock(mu_);
    return remember(news_);
  }

  void publishWorkers(std::vector<LocalWorker> workers) override {
    std::lock_guard<std::mutex> lock(mu_);
    workers_ = std::move(workers);
  }

  Decision workersFailed(int rank, int exit_code, const std::string& description) override {
    try {
      return remember(decisionOf(
          link_->requestRestart(node_.id, round_, {node_.id, rank, exit_code, description}),
          node_.id));
    } catch (const Error& e) {
      return {
          Decision::Kind::kFail, std::string("cannot reach the rendezvous: ") + e.what(), {}, {}};
    }
  }

  Decision workersSucceeded() override {
    left_ = true;
    try {
      return remember(decisionOf(link_->leave(node_.id, round_), node_.id));
    } catch (const Error& e) {
      return {Decision::Kind::kDone, std::string("the rendezvous is gone: ") + e.what(), {}, {}};
    }
  }

  std::chrono::milliseconds exitBarrier() const override { return options_.close_timeout; }

  void finish() override {
    unwatch();
    link_->close();
    if (server_ && ended_ && num_nodes_ > 1) {
      server_->waitUntilSettled(
          run_id_, options_.keep_alive_interval * (options_.keep_alive_max_misses + 1));
      // A node counts as told when its answer is written, not when it has arrived: the process
      // exits right after this, and would cut the last answers off (the peer then waits out the
      // eviction timeout for a server that is gone). Shutdown lets calls in flight complete.
      server_->shutdown();
    }
  }

 private:
  // Hosts the server when the endpoint is on this machine and free (or there is none).
  void host(const std::string& endpoint, const LaunchOptions& options) {
    rdzv::ServerOptions server;
    if (!endpoint.empty()) {
      const HostPort where = splitEndpoint(endpoint);
      server.host = where.host;
      server.port = where.port;
    }
    server.token = options.rdzv.token;
    server.tls_cert_file = options.rdzv.tls_cert;
    server.tls_key_file = options.rdzv.tls_key;
    server.tls_ca_file = options.rdzv.tls_cert.empty() ? "" : options.rdzv.tls_ca;
    try {
      server_ = std::make_unique<rdzv::RendezvousServer>(server);
    } catch (const CommunicationError&) {
      if (options.rdzv.is_host.value_or(false) || endpoint.empty()) throw;
      // Someone else serves it (another launcher here, cxxlaunchd, or another host).
      return;
    }
    // As cxxlaunchd does: a server others can reach without TLS is worth a line.
    if (const std::string warning = rdzv::exposureWarning(server); !warning.empty()) {
      std::cerr << "cxxlaunch: " << warning << "\n";
    }
  }

  // Notes whether the job has ended (closed or failed): only then does a hosting launcher
  // linger so that its peers learn the outcome.
  Decision remember(Decision d) {
    ended_ = ended_ || d.kind == Decision::Kind::kDone || d.kind == Decision::Kind::kFail;
    return d;
  }

  WorldAssignment assignmentOf(const rdzv::Placement& p) {
    round_ = p.round;
    num_nodes_ = p.num_nodes;
    left_ = false;
    WorldAssignment w;
    w.round = p.round;
    w.node_rank = p.node_rank;
    w.num_nodes = p.num_nodes;
    w.rank_offset = p.rank_offset;
    w.world_size = p.world_size;
    w.restart_count = p.restart_count;
    w.master_addr = p.master_addr;
    w.master_port = p.master_port;
    w.node_addr = node_.addr;
    w.store_endpoint = client_options_.endpoint;
    w.store_prefix = rdzv::storePrefix(run_id_, p.round);
    w.token = client_options_.token;
    w.store_user = store_user_;
    w.tls_ca = client_options_.tls_ca_file;
    w.tls_cert = client_options_.tls_cert_file;
    w.tls_key = client_options_.tls_key_file;
    return w;
  }

  // Sends keep-alives until a verdict other than "continue" (then `news`), or until the server
  // has not answered for keep_alive_interval * keep_alive_max_misses (the eviction timeout the
  // server applies to us, so both sides give up at about the same time).
  //  - Every interval while the workers run. Each call's deadline is at most one interval and
  //    never past the moment the server counts as lost: a stopped server is noticed then, not
  //    after max_misses full call timeouts.
  //  - After this node left (the exit barrier), first after 50 ms, then twice as long each time
  //    up to the interval: the last node's leave closes the run, and the nodes that finished
  //    first should hear it within tens of milliseconds, not a whole interval later.
  void keepAliveLoop(const std::function<void()>& news) {
    using rdzv::Millis;
    const Millis interval = options_.keep_alive_interval;
    const Millis lost_after = interval * options_.keep_alive_max_misses;
    auto last_answer = Clock::now();
    Millis pause = left_ ? std::min(Millis(50), interval) : interval;
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      wake_.wait_for(lock, pause, [&] { return stop_; });
      if (stop_) return;
      const std::vector<LocalWorker> workers = workers_;
      lock.unlock();
      pause = std::min(pause * 2, interval);
      const auto silent = std::chrono::duration_cast<Millis>(Clock::now() - last_answer);
      const Millis deadline = std::max(Millis(100), std::min(interval, lost_after - silent));
      Decision decision;
      bool report = false;
      try {
        decision =
            decisionOf(link_->keepAlive(node_.id, round_, deadline, progressOf(workers)), node_.id);
        last_answer = Clock::now();
        report = decision.kind != Decision::Kind::kWait;
      } catch (const Error& e) {
        const auto since = Clock::now() - last_answer;
        if (since >= lost_after) {
          report = true;
          decision = left_ ? Decision{Decision::Kind::kDone,
                                      std::string("the rendezvous server is gone: ") + e.what(),
                                      {},
                                      {}}
                           : Decision{Decision::Kind::kFail,
                                      std::string("lost the rendezvous server: ") + e.what(),
                                      {},
                                      {}};
        } else {
          // Look again when the server would count as lost, if that comes before the interval.
          pause =
              std::max(Millis(1),
                       std::min(interval, std::chrono::duration_cast<Millis>(lost_after - since)));
        }
      }
      lock.lock();
      if (report) {
        news_ = decision;
        lock.unlock();
        news();
        return;
      }
    }
  }

  const RendezvousOptions options_;
  rdzv::ClientOptions client_options_;
  std::string run_id_;
  std::string store_user_;  // etcd: the user the workers' store authenticates as
  std::unique_ptr<rdzv::RendezvousServer> server_;
  std::unique_ptr<RendezvousLink> link_;  // after server_: it may refer to it
  rdzv::NodeSpec node_;
  rdzv::RunSettings settings_;
  int64_t round_ = 0;
  int num_nodes_ = 1;  // of the last round: a hosting node lingers only for its peers
  std::atomic<bool> left_ = false;
  std::atomic<bool> cancelled_ = false;
  bool ended_ = false;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  Decision news_;
  std::vector<LocalWorker> workers_;  // reported with each keep-alive
  std::thread watcher_;
};

}  // namespace

rendezvous::EtcdOptions etcdOptionsOf(const RendezvousOptions& r) {
  rendezvous::EtcdOptions eo;
  eo.endpoints =
      rendezvous::parseEtcdEndpoints(r.etcd_endpoints.empty() ? r.endpoint : r.etcd_endpoints);
  eo.user = r.etcd_user;
  eo.password = r.etcd_password;
  eo.tls_ca_file = r.tls_ca;
  eo.tls_cert_file = r.tls_cert;
  eo.tls_key_file = r.tls_key;
  return eo;
}

std::string etcdKeyRoot(const RendezvousOptions& r) {
  return r.etcd_root.empty() ? rendezvous::kEtcdRoot : r.etcd_root;
}

std::unique_ptr<NodeRendezvous> makeNodeRendezvous(const LaunchOptions& options) {
  return std::make_unique<RemoteRendezvous>(options);
}

}  // namespace cxxlaunch::launcher
