#pragma once
// Clients of the rendezvous server: GrpcStore (the Store interface over gRPC, what workers use)
// and RendezvousClient (what node agents use). Both speak to cxxlaunchd or to a launcher's
// embedded server.
//
// Thread-safety: both are safe to call from several threads; RendezvousClient::cancel() may be
// called from any thread to end a join in progress.

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "rendezvous/run_state.h"
#include "rendezvous/store.h"

namespace grpc {
class Channel;
class ClientContext;
}  // namespace grpc

namespace cxxlaunch::rendezvous {

struct ClientOptions {
  std::string endpoint;       // host:port
  std::string token;          // sent with every call when non-empty
  std::string tls_ca_file;    // non-empty: TLS, trusting this CA
  std::string tls_cert_file;  // with tls_key_file: our client certificate (mTLS)
  std::string tls_key_file;
  Millis call_timeout = std::chrono::seconds(30);  // for calls that do not wait by design
};

// Throws InvalidArgument for unreadable TLS files.
std::shared_ptr<grpc::Channel> makeChannel(const ClientOptions& options);

// The Store of one rendezvous round: keys live on the server under (run id, round). Once the run
// moves to another round every call fails with StaleError: the round is a fencing token.
class GrpcStore final : public Store {
 public:
  GrpcStore(const ClientOptions& options, std::string run_id, int64_t round);

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Timeout timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override;
  void wait(const std::vector<std::string>& keys, Timeout timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool deleteKey(const std::string& key) override;
  int64_t numKeys() override;
  std::vector<std::string> multiGet(const std::vector<std::string>& keys, Timeout timeout) override;
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::string>& values) override;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// "run_id/round" as the launcher passes it to workers (CXXLAUNCH_STORE_PREFIX), and back.
std::string storePrefix(const std::string& run_id, int64_t round);
std::pair<std::string, int64_t> parseStorePrefix(const std::string& prefix);

struct JoinPoll {
  std::optional<Placement> placement;  // set when the round is complete
  std::string waiting_for;             // otherwise: who joined, who is missing
};

class RendezvousClient {
 public:
  RendezvousClient(const ClientOptions& options, std::string run_id);
  // Over a given channel (e.g. RendezvousServer::inProcessChannel); `options` gives the token
  // and timeouts.
  RendezvousClient(const ClientOptions& options, std::string run_id,
                   std::shared_ptr<grpc::Channel> channel);
  ~RendezvousClient();

  // One poll of Join: waits at most `poll` on the server. Waits for the server to come up (a
  // node may start before the daemon). Throws CommunicationError when it cannot be reached
  // within `poll` + the call timeout, StaleError for a closed or failed run, InvalidArgument for
  // settings that contradict the run's, and for an endpoint that answers but is not a
  // rendezvous server (until a server has answered, each poll first probes the endpoint:
  // rendezvous/endpoint_probe.h; a silent one is a CommunicationError).
  JoinPoll join(const NodeSpec& node, const RunSettings& settings, Millis poll);
  // `timeout`: the call's deadline when shorter than the call timeout (a keep-alive must not
  // outlast the interval it reports on); 0: the call timeout. `workers`: how this node's workers
  // are doing (for status); empty: no news.
  Verdict keepAlive(const std::string& node_id, int64_t round, Millis timeout = Millis(0),
                    const std::vector<WorkerProgress>& workers = {});
  Verdict requestRestart(const std::string& node_id, int64_t round, const FailureReport& failure);
  Verdict leave(const std::string& node_id, int64_t round);
  RunStatus status();

  // Ends a join() in progress (it throws CommunicationError).
  void cancel();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cxxlaunch::rendezvous
