#pragma once
// NodeRendezvous: how a node agent learns its place in the world and agrees with the other
// nodes on restarts and on the end of the job, through a rendezvous server (cxxlaunchd, or one
// this launcher hosts; a single-node job hosts a private one on loopback).
//
// Thread-safety: join(), workersFailed() and workersSucceeded() are called from the agent's
// thread; cancelJoin() and the watch callback may run on other threads.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/options.h"
#include "rendezvous/etcd_client.h"

namespace cxxlaunch::launcher {

// Where this node stands in the world, as a rendezvous round decided it.
struct WorldAssignment {
  int64_t round = 0;
  int node_rank = 0;
  int num_nodes = 1;
  int rank_offset = 0;  // global rank of this node's local rank 0
  int world_size = 1;
  int restart_count = 0;  // failure restarts of the job so far: TORCHELASTIC_RESTART_COUNT
  std::string master_addr;
  int master_port = 0;
  std::string node_addr;       // this node's address, as the others reach it
  std::string store_endpoint;  // empty when there is no store for workers
  std::string store_prefix;
  std::string token;                      // etcd: the password of store_user
  std::string store_user;                 // etcd: the user the workers authenticate as; empty: none
  std::string tls_ca, tls_cert, tls_key;  // for workers' store connections
};

// A local worker as the agent knows it; its state and heartbeat age are read when a keep-alive
// goes out, for `cxxlaunch status`.
struct LocalWorker {
  int local_rank = 0;
  int global_rank = 0;
  int pid = -1;
  bool running = false;        // false once reaped: the pid may belong to someone else
  std::string heartbeat_file;  // CXXLAUNCH_HEARTBEAT_FILE
};

// What happens next, as the nodes agreed.
struct Decision {
  // kWait: only from workersSucceeded(), while other nodes still run; watch() tells the outcome.
  enum class Kind { kRestart, kFail, kDone, kWait };
  Kind kind = Kind::kDone;
  std::string reason;
  // With kFail: the job's root cause when it was on another node (its exit code and text).
  std::optional<int> remote_exit_code;
  std::string remote_description;
};

class NodeRendezvous {
 public:
  virtual ~NodeRendezvous() = default;

  // Joins the next round. Throws TimeoutError naming who is missing, StaleError for a closed or
  // failed run, CommunicationError when cancelled.
  virtual WorldAssignment join() = 0;
  virtual void cancelJoin() {}
  // Joins the next round when that needs no waiting and no network (a single-node job joining
  // the server it hosts); nullopt: call join(). Throws as join() does.
  virtual std::optional<WorldAssignment> joinAtOnce() { return std::nullopt; }

  // While workers run: `news` is called (from another thread) when the world changed under them
  // (a restart elsewhere, an eviction, a newcomer, the job failed); news() then says what to do.
  virtual void watch(std::function<void()> news) { (void)news; }
  virtual void unwatch() {}
  virtual Decision news() { return {}; }

  // The workers each keep-alive reports on (their state and time since their last heartbeat,
  // read then), until the next call. Called from the agent's thread when they change.
  virtual void publishWorkers(std::vector<LocalWorker> workers) { (void)workers; }

  // This node's workers failed (`rank`, `exit_code`, `description` of the root cause): restart
  // everywhere if restarts are left, else the job fails.
  virtual Decision workersFailed(int rank, int exit_code, const std::string& description) = 0;

  // This node's workers all succeeded. kWait: other nodes still run; watch() until news comes
  // (the run closed, or a restart pulls this node back in), at most exitBarrier().
  virtual Decision workersSucceeded() = 0;
  virtual std::chrono::milliseconds exitBarrier() const { return std::chrono::milliseconds(0); }

  // Before the launcher exits: a hosted server lingers until its peers know the outcome.
  virtual void finish() {}
};

// The rendezvous for these options. Hosts the server when this node should (always for a
// single-node job). Throws InvalidArgument / CommunicationError.
std::unique_ptr<NodeRendezvous> makeNodeRendezvous(const LaunchOptions& options);

// --rdzv_backend etcd, for the agents and `cxxlaunch status`: the client of the members
// --rdzv_endpoint names (or a config file's main_process_ip:port), with --rdzv_conf's user,
// password and TLS files; and the key root of the runs (etcd_prefix, else /cxxlaunch/).
rendezvous::EtcdOptions etcdOptionsOf(const RendezvousOptions& r);
std::string etcdKeyRoot(const RendezvousOptions& r);

}  // namespace cxxlaunch::launcher
