#include "rendezvous/server/rendezvous_service.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>

namespace cxxlaunch::rendezvous::server {

std::string undecodableMessage(const std::string& method) {
  return "the request to " + method +
         " is not a valid message of proto/rendezvous.proto (client and server of different "
         "versions?)";
}

namespace {

// The Join service's steps:
// 1. Register the node (RunState::join) and refresh its keep-alive.
// 2. If its round is complete, answer with its placement at once.
// 3. Else park the call until the round completes, the run ends, or the poll time passes
//    (capped below the eviction timeout, so a waiting node never looks silent).
// Returns the status to answer with now (and `resp` filled in), or nullopt when parked: the
// ParkedCall `make_parked()` gave is answered later.
template <typename MakeParked>
std::optional<grpc::Status> serveJoin(Core& core, const grpc::ServerContextBase& ctx,
                                      const rdzv::JoinRequest& req, rdzv::JoinResponse& resp,
                                      MakeParked&& make_parked) {
  const RunSettings settings = wire::fromProto(req.settings());
  const NodeSpec node = wire::fromProto(req.node());
  Millis wait{0};
  auto prepare = [&] {
    const RunSettings& s = core.join(req.run_id(), node, settings, Clock::now()).state.settings();
    wait = std::min({waitTime(req.poll_ms(), core.options().max_wait), s.keep_alive_interval,
                     s.evictionTimeout() / 2});
    return grpc::Status::OK;
  };
  const std::string& run_id = req.run_id();
  return core.park(
      ctx, run_id, /*keys=*/{}, prepare, wait,
      [&core, run_id, id = node.id, out = &resp](bool expired) -> std::optional<grpc::Status> {
        Run& run = core.runOf(run_id);
        if (auto placement = run.state.placementOf(id)) {
          out->set_complete(true);
          wire::toProto(*placement, out->mutable_round());
          return grpc::Status::OK;
        }
        run.state.checkNotFinal();
        if (expired) {
          out->set_complete(false);
          out->set_waiting_for(run.state.waitingFor());
          return grpc::Status::OK;
        }
        return std::nullopt;
      },
      make_parked);
}

// One Join: requested, then served, then answered (at once or when its round moves).
class JoinCall final : public ParkedCall {
 public:
  explicit JoinCall(Joins& joins) : joins_(joins) {
    joins.service().RequestJoin(&ctx_, &request_, &writer_, joins.queue(), joins.queue(), this);
  }

  // The queue's event for this call: a request arrived (ok), the answer went out, or the
  // server is shutting down (!ok).
  void proceed(bool ok) {
    if (answered_ || !ok || joins_.closing()) {
      // An answer given on another thread is complete before its event comes; gRPC's own
      // ordering is invisible to ThreadSanitizer, this lock is not.
      { std::lock_guard<std::mutex> lock(answering_); }
      delete this;
      return;
    }
    new JoinCall(joins_);  // the next request's slot
    rdzv::JoinRequest req;
    if (!grpc::SerializationTraits<rdzv::JoinRequest>::Deserialize(&request_, &req).ok()) {
      answer({grpc::StatusCode::INVALID_ARGUMENT,
              undecodableMessage("/cxxlaunch.rdzv.Rendezvous/Join")});
      return;
    }
    request_.Clear();  // a parked join keeps only what it answers with
    std::optional<grpc::Status> now;
    const grpc::Status error = wire::guarded([&] {
      now = serveJoin(joins_.core(), ctx_, req, response_, [this] { return this; });
      return grpc::Status::OK;
    });
    if (!error.ok()) {
      answer(error);
    } else if (now) {
      answer(*now);
    }
  }

  void answer(const grpc::Status& status) override {
    std::lock_guard<std::mutex> lock(answering_);
    answered_ = true;
    if (!status.ok()) {
      writer_.FinishWithError(status, this);
      return;
    }
    bool own = false;
    const grpc::Status encoded =
        grpc::SerializationTraits<rdzv::JoinResponse>::Serialize(response_, &reply_, &own);
    if (encoded.ok()) {
      writer_.Finish(reply_, status, this);
    } else {
      writer_.FinishWithError(encoded, this);
    }
  }

 private:
  Joins& joins_;
  grpc::ServerContext ctx_;
  grpc::ByteBuffer request_;
  grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> writer_{&ctx_};
  rdzv::JoinResponse response_;
  grpc::ByteBuffer reply_;
  std::mutex answering_;
  std::atomic<bool> answered_ = false;  // set by whichever thread answers
};

}  // namespace

void Joins::serve() {
  grpc::ServerCompletionQueue* queue = ready_.get_future().get();
  if (queue == nullptr) return;
  // Requests taken ahead, so that a burst of joins does not wait for a slot.
  for (int i = 0; i < 64; ++i) new JoinCall(*this);
  void* tag = nullptr;
  bool ok = false;
  while (queue->Next(&tag, &ok)) {
    if (tag == &close_alarm_) {
      closing_ = true;
      queue->Shutdown();
      continue;
    }
    static_cast<JoinCall*>(tag)->proceed(ok);
  }
}

void Joins::close() {
  if (!thread_.joinable()) return;
  if (accepting_) {
    close_alarm_ = std::make_unique<grpc::Alarm>();
    close_alarm_->Set(queue_.get(), gpr_now(GPR_CLOCK_MONOTONIC), &close_alarm_);
    thread_.join();
    return;
  }
  ready_.set_value(nullptr);  // the server did not start: nothing was asked of the queue
  thread_.join();
  if (queue_) {
    queue_->Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (queue_->Next(&tag, &ok)) {
    }
  }
}
grpc::ServerUnaryReactor* RendezvousService::KeepAlive(grpc::CallbackServerContext* ctx,
                                                       const rdzv::KeepAliveRequest* req,
                                                       rdzv::KeepAliveResponse* resp) {
  return core_.answer(ctx, req->run_id(), [&] {
    Run& run = core_.runOf(req->run_id());
    std::vector<WorkerProgress> workers;
    workers.reserve(static_cast<size_t>(req->workers_size()));
    for (const auto& w : req->workers()) workers.push_back(wire::fromProto(w));
    core_.report(run.state, req->node_id(), std::move(workers));
    wire::toProto(run.state.keepAlive(req->node_id(), req->round(), Clock::now()), resp);
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* RendezvousService::RequestRestart(grpc::CallbackServerContext* ctx,
                                                            const rdzv::RestartRequest* req,
                                                            rdzv::KeepAliveResponse* resp) {
  return core_.answer(ctx, req->run_id(), [&] {
    Run& run = core_.runOf(req->run_id());
    wire::toProto(run.state.requestRestart(req->node_id(), req->round(),
                                           core_.failureToKeep(wire::fromProto(req->failure())),
                                           Clock::now()),
                  resp);
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* RendezvousService::Leave(grpc::CallbackServerContext* ctx,
                                                   const rdzv::LeaveRequest* req,
                                                   rdzv::KeepAliveResponse* resp) {
  return core_.answer(ctx, req->run_id(), [&] {
    Run& run = core_.runOf(req->run_id());
    wire::toProto(run.state.leave(req->node_id(), req->round(), Clock::now()), resp);
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* RendezvousService::Status(grpc::CallbackServerContext* ctx,
                                                    const rdzv::StatusRequest* req,
                                                    rdzv::StatusResponse* resp) {
  return core_.answer(ctx, req->run_id(), [&] {
    Run& run = core_.runOf(req->run_id());
    wire::toProto(run.state.status(Clock::now()), resp);
    return grpc::Status::OK;
  });
}

}  // namespace cxxlaunch::rendezvous::server
