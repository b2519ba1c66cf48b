#include "launcher/rendezvous_link.h"

#include "common/error.h"
#include "rendezvous/etcd_rendezvous.h"

namespace cxxlaunch::launcher {
namespace rdzv = cxxlaunch::rendezvous;
namespace {

class GrpcLink final : public RendezvousLink {
 public:
  GrpcLink(const rdzv::ClientOptions& options, const std::string& run_id)
      : client_(options, run_id) {}
  rdzv::JoinPoll join(const rdzv::NodeSpec& node, const rdzv::RunSettings& settings,
                      rdzv::Millis poll) override {
    return client_.join(node, settings, poll);
  }
  void cancel() override { client_.cancel(); }
  rdzv::Verdict keepAlive(const std::string& node_id, int64_t round, rdzv::Millis timeout,
                          const std::vector<rdzv::WorkerProgress>& workers) override {
    return client_.keepAlive(node_id, round, timeout, workers);
  }
  rdzv::Verdict requestRestart(const std::string& node_id, int64_t round,
                               const rdzv::FailureReport& failure) override {
    return client_.requestRestart(node_id, round, failure);
  }
  rdzv::Verdict leave(const std::string& node_id, int64_t round) override {
    return client_.leave(node_id, round);
  }

 private:
  rdzv::RendezvousClient client_;
};

class HostedLink final : public RendezvousLink {
 public:
  HostedLink(rdzv::RendezvousServer& server, std::string run_id)
      : server_(server), run_id_(std::move(run_id)) {}
  rdzv::JoinPoll join(const rdzv::NodeSpec& node, const rdzv::RunSettings& settings,
                      rdzv::Millis poll) override {
    return server_.join(run_id_, node, settings, poll, cancelled_);
  }
  void cancel() override {
    cancelled_ = true;
    server_.wakeJoins();
  }
  rdzv::Verdict keepAlive(const std::string& node_id, int64_t round, rdzv::Millis,
                          const std::vector<rdzv::WorkerProgress>& workers) override {
    return server_.keepAlive(run_id_, node_id, round, workers);
  }
  rdzv::Verdict requestRestart(const std::string& node_id, int64_t round,
                               const rdzv::FailureReport& failure) override {
    return server_.requestRestart(run_id_, node_id, round, failure);
  }
  rdzv::Verdict leave(const std::string& node_id, int64_t round) override {
    return server_.leave(run_id_, node_id, round);
  }

 private:
  rdzv::RendezvousServer& server_;
  const std::string run_id_;
  std::atomic<bool> cancelled_ = false;
};

// --rdzv_backend etcd: no server; the agents agree through an etcd cluster
// (rendezvous/etcd_rendezvous.h).
class EtcdLink final : public RendezvousLink {
 public:
  EtcdLink(std::shared_ptr<rdzv::EtcdClient> client, const std::string& run_id,
           const std::string& root)
      : rendezvous_(std::move(client), run_id, root) {}
  rdzv::JoinPoll join(const rdzv::NodeSpec& node, const rdzv::RunSettings& settings,
                      rdzv::Millis poll) override {
    return rendezvous_.join(node, settings, poll);
  }
  void cancel() override { rendezvous_.cancel(); }
  rdzv::Verdict keepAlive(const std::string& node_id, int64_t round, rdzv::Millis timeout,
                          const std::vector<rdzv::WorkerProgress>& workers) override {
    return rendezvous_.keepAlive(node_id, round, workers, timeout);
  }
  rdzv::Verdict requestRestart(const std::string& node_id, int64_t round,
                               const rdzv::FailureReport& failure) override {
    return rendezvous_.requestRestart(node_id, round, failure);
  }
  rdzv::Verdict leave(const std::string& node_id, int64_t round) override {
    return rendezvous_.leave(node_id, round);
  }
  void close() override {
    try {
      rendezvous_.close();
    } catch (const Error&) {
      // etcd is unreachable: the lease expires on its own.
    }
  }

 private:
  rdzv::EtcdRendezvous rendezvous_;
};

}  // namespace

std::unique_ptr<RendezvousLink> grpcLink(const rendezvous::ClientOptions& options,
                                         const std::string& run_id) {
  return std::make_unique<GrpcLink>(options, run_id);
}

std::unique_ptr<RendezvousLink> hostedLink(rendezvous::RendezvousServer& server,
                                           std::string run_id) {
  return std::make_unique<HostedLink>(server, std::move(run_id));
}

std::unique_ptr<RendezvousLink> etcdLink(std::shared_ptr<rendezvous::EtcdClient> client,
                                         const std::string& run_id, const std::string& root) {
  return std::make_unique<EtcdLink>(std::move(client), run_id, root);
}

}  // namespace cxxlaunch::launcher
