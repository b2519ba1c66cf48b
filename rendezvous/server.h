#pragma once
// RendezvousServer: the gRPC server with the Store and Rendezvous services of
// proto/rendezvous.proto. cxxlaunchd runs one; a launcher embeds one for simple jobs.
//
// Many runs (run ids) share a server and never see each other's state. Blocking calls (store
// get/wait, join) hold no thread while they wait: they are parked and answered when the state
// changes or their deadline passes, so thousands of nodes can wait at once.
//
// Thread-safety: all methods may be called from any thread.

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "rendezvous/client.h"
#include "rendezvous/memory_store.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace cxxlaunch::rendezvous {

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless told otherwise
  int port = 0;                    // 0: pick a free port (see RendezvousServer::port)
  std::string token;               // non-empty: every call must present it
  std::string tls_cert_file;       // with tls_key_file: serve TLS only
  std::string tls_key_file;
  std::string tls_ca_file;  // with TLS: also require client certificates signed by it
  // Larger requests and answers: RESOURCE_EXHAUSTED. Above the largest value, so that any value
  // the store takes can be read back, alone or in a MultiGet of several.
  int max_message_bytes = kDefaultMaxMessageBytes;
  std::chrono::milliseconds max_wait = std::chrono::minutes(10);  // cap on every blocking call
  // Each run's key space, and all runs together (docs/reliability.md): one client cannot take
  // the daemon's memory. The total counts every store's keys and values and every run's state
  // (nodes, worker reports, failure descriptions); 0: no bound.
  StoreLimits store_limits = kDefaultStoreLimits;
  int64_t max_total_bytes = kDefaultMaxTotalBytes;
  // How long a run stays after it closed or failed (for `cxxlaunch status` and late joins that
  // should hear "closed"), and after its last call when no node of it is alive any more (joins
  // that never completed). Then its state is freed.
  std::chrono::milliseconds run_retention = std::chrono::minutes(10);
  // With port 0 on an IPv4 host and no TLS: the constructor only listens on a port with a plain
  // socket, and gRPC starts when the first client connects, which gets that connection. A
  // launcher whose workers never use the store never starts gRPC (5 to 10 ms and eleven
  // threads); its own node (join(), keepAlive() ...) is served at once. A start that fails is
  // reported by checkStarted(). Otherwise (or when false) gRPC has started on return.
  bool start_on_first_connection = false;

  static constexpr int kDefaultMaxMessageBytes = 64 << 20;
  static constexpr int64_t kDefaultMaxTotalBytes = int64_t{1} << 30;
  static constexpr StoreLimits kDefaultStoreLimits{.max_keys = 100'000,
                                                   .max_bytes = 64 << 20,
                                                   .max_key_bytes = 4096,
                                                   .max_value_bytes = 16 << 20};
};

class RendezvousServer {
 public:
  // Starts serving. Throws CommunicationError when it cannot listen (address in use, not a local
  // address) and InvalidArgument for unreadable TLS files.
  explicit RendezvousServer(const ServerOptions& options);
  ~RendezvousServer();  // shuts down
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  int port() const;
  std::string endpoint() const;  // host:port

  // start_on_first_connection: throws what kept gRPC from starting (what the constructor throws
  // otherwise), once a client came; waits for a start in progress.
  void checkStarted();

  // A channel to this server that skips the network. Carries no TLS; the token is still checked.
  // Not with start_on_first_connection.
  std::shared_ptr<grpc::Channel> inProcessChannel();

  // The node agent of the process that hosts this server (a launcher that hosts its job's
  // rendezvous), without RPC: the Rendezvous service's Join, KeepAlive, RequestRestart and
  // Leave on the same runs, under the same lock, so nodes over gRPC and this one see each
  // other's changes as they see RPCs. No token: it is this process. They throw what the
  // service's answer means (StaleError, InvalidArgument), and CommunicationError once the
  // server shuts down. join() is one poll: it waits at most `poll` (capped as a Join's) for the
  // round; it throws CommunicationError when it finds `cancelled` set, which wakeJoins() makes
  // it look at at once.
  JoinPoll join(const std::string& run_id, const NodeSpec& node, const RunSettings& settings,
                Millis poll, const std::atomic<bool>& cancelled);
  // `workers`: how this node's workers are doing (for status), as RendezvousClient::keepAlive.
  Verdict keepAlive(const std::string& run_id, const std::string& node_id, int64_t round,
                    const std::vector<WorkerProgress>& workers = {});
  Verdict requestRestart(const std::string& run_id, const std::string& node_id, int64_t round,
                         const FailureReport& failure);
  Verdict leave(const std::string& run_id, const std::string& node_id, int64_t round);
  void wakeJoins();

  // Waits until the run is closed or failed and every node of its last round has been told, or
  // `timeout` passes. A launcher that embeds the server calls it before it exits, so that its
  // peers learn the outcome. Returns whether everyone was told.
  bool waitUntilSettled(const std::string& run_id, std::chrono::milliseconds timeout);

  // How many runs the server holds (live, and finished ones within their retention).
  size_t runCount() const;
  // The bytes counted against max_total_bytes now.
  int64_t heldBytes() const;

  void shutdown();
  // Blocks until shutdown() (from another thread or a signal handler's helper).
  void wait();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cxxlaunch::rendezvous
