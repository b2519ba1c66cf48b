#pragma once
// RendezvousLink: how a node's agent reaches the rendezvous (NodeRendezvous, node_rendezvous.h):
// a server elsewhere (cxxlaunchd, another node's launcher) over gRPC, the server this launcher
// hosts, called directly (no channel, no RPC: the same calls on the same state, so the other
// nodes cannot tell the difference), or an etcd cluster (--rdzv_backend etcd, no server).
//
// Thread-safety: cancel() may run on any thread; the calls are made from one thread at a time.

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "rendezvous/client.h"
#include "rendezvous/etcd_client.h"
#include "rendezvous/server.h"

namespace cxxlaunch::launcher {

class RendezvousLink {
 public:
  virtual ~RendezvousLink() = default;
  virtual rendezvous::JoinPoll join(const rendezvous::NodeSpec& node,
                                    const rendezvous::RunSettings& settings,
                                    rendezvous::Millis poll) = 0;
  virtual void cancel() = 0;  // ends a join in progress: it throws CommunicationError
  virtual rendezvous::Verdict keepAlive(const std::string& node_id, int64_t round,
                                        rendezvous::Millis timeout,
                                        const std::vector<rendezvous::WorkerProgress>& workers) = 0;
  virtual rendezvous::Verdict requestRestart(const std::string& node_id, int64_t round,
                                             const rendezvous::FailureReport& failure) = 0;
  virtual rendezvous::Verdict leave(const std::string& node_id, int64_t round) = 0;
  virtual void close() {}  // before the launcher exits
};

// Over gRPC, to the server at options.endpoint.
std::unique_ptr<RendezvousLink> grpcLink(const rendezvous::ClientOptions& options,
                                         const std::string& run_id);
// The server this launcher hosts, which must outlive the link.
std::unique_ptr<RendezvousLink> hostedLink(rendezvous::RendezvousServer& server,
                                           std::string run_id);
// Through etcd, under the key root `root` (rendezvous/etcd_rendezvous.h).
std::unique_ptr<RendezvousLink> etcdLink(std::shared_ptr<rendezvous::EtcdClient> client,
                                         const std::string& run_id, const std::string& root);

}  // namespace cxxlaunch::launcher
