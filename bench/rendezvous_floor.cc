// The limit gRPC itself sets for rendezvous_join_bench: a server that only counts Join calls and
// answers all of them once a run's min_nodes have come, with placements in order of arrival, and
// answers KeepAlive at once. No store, no run state, no deadlines, no token, nothing persisted.
//
// It is served as cxxlaunchd serves Join: gRPC's completion-queue API with one queue and one
// thread, and no gRPC timer for a call's deadline (deadline checks off). So it pays what
// cxxlaunchd's joins pay inside gRPC, including the debug checks of this machine's gRPC
// (Debian's, built without NDEBUG: each open call keeps a tag on the queue, and every completion
// scans them), and nothing else: the time cxxlaunchd cannot go below on the same machine.
//
// usage: rendezvous_floor_server   (any arguments ignored; prints "listening on 127.0.0.1:PORT"
// as cxxlaunchd does, so that the benchmark starts it the same way)

#include <absl/synchronization/mutex.h>
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "proto/rendezvous.grpc.pb.h"

namespace {

namespace rdzv = cxxlaunch::rdzv;
using Service = rdzv::Rendezvous::WithAsyncMethod_Join<
    rdzv::Rendezvous::WithAsyncMethod_KeepAlive<rdzv::Rendezvous::Service>>;

// One call: requested, then answered; `proceed` runs when its completion-queue event arrives.
class Call {
 public:
  virtual ~Call() = default;
  virtual void proceed(bool ok) = 0;
};

class JoinCall;

struct Server {
  Service service;
  std::unique_ptr<grpc::ServerCompletionQueue> queue;
  std::map<std::string, std::vector<JoinCall*>> waiting;  // by run id; one thread: no lock
};

class JoinCall final : public Call {
 public:
  explicit JoinCall(Server& server) : server_(server) {
    server.service.RequestJoin(&ctx_, &request_, &writer_, server.queue.get(), server.queue.get(),
                               this);
  }

  void proceed(bool ok) override {
    if (answered_ || !ok) {  // answered and sent, or the server is shutting down
      delete this;
      return;
    }
    new JoinCall(server_);  // the next call's slot
    auto& run = server_.waiting[request_.run_id()];
    run.push_back(this);
    if (static_cast<int>(run.size()) < request_.settings().min_nodes()) return;
    const std::vector<JoinCall*> round = std::move(run);
    server_.waiting.erase(request_.run_id());
    for (size_t rank = 0; rank < round.size(); ++rank) {
      round[rank]->answer(static_cast<int>(rank), static_cast<int>(round.size()));
    }
  }

 private:
  void answer(int node_rank, int world_size) {
    answered_ = true;
    response_.set_complete(true);
    response_.mutable_round()->set_node_rank(node_rank);
    response_.mutable_round()->set_world_size(world_size);
    writer_.Finish(response_, grpc::Status::OK, this);
  }

  Server& server_;
  grpc::ServerContext ctx_;
  rdzv::JoinRequest request_;
  rdzv::JoinResponse response_;
  grpc::ServerAsyncResponseWriter<rdzv::JoinResponse> writer_{&ctx_};
  bool answered_ = false;
};

class KeepAliveCall final : public Call {
 public:
  explicit KeepAliveCall(Server& server) : server_(server) {
    server.service.RequestKeepAlive(&ctx_, &request_, &writer_, server.queue.get(),
                                    server.queue.get(), this);
  }

  void proceed(bool ok) override {
    if (answered_ || !ok) {
      delete this;
      return;
    }
    new KeepAliveCall(server_);
    answered_ = true;
    writer_.Finish(response_, grpc::Status::OK, this);
  }

 private:
  Server& server_;
  grpc::ServerContext ctx_;
  rdzv::KeepAliveRequest request_;
  rdzv::KeepAliveResponse response_;
  grpc::ServerAsyncResponseWriter<rdzv::KeepAliveResponse> writer_{&ctx_};
  bool answered_ = false;
};

}  // namespace

int main() {
  // As cxxlaunchd: Debian's abseil otherwise runs its deadlock detector on every lock.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  Server server;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.AddChannelArgument(GRPC_ARG_ENABLE_DEADLINE_CHECKS, 0);  // as cxxlaunchd
  builder.RegisterService(&server.service);
  server.queue = builder.AddCompletionQueue();
  auto grpc_server = builder.BuildAndStart();
  if (!grpc_server) {
    std::fprintf(stderr, "rendezvous_floor_server: could not listen on 127.0.0.1\n");
    return 1;
  }
  std::printf("listening on 127.0.0.1:%d\n", port);
  std::fflush(stdout);
  // Calls requested ahead, as gRPC's own callback server keeps some: arrivals never wait for a
  // slot.
  for (int i = 0; i < 64; ++i) {
    new JoinCall(server);
    new KeepAliveCall(server);
  }
  void* tag = nullptr;
  bool ok = false;
  while (server.queue->Next(&tag, &ok)) static_cast<Call*>(tag)->proceed(ok);  // until killed
  return 0;
}
