#pragma once
// The Rendezvous service of proto/rendezvous.proto: Join on gRPC's completion-queue API, served
// by a thread of its own (Joins), and KeepAlive, RequestRestart, Leave and Status on its
// callback API. Every call goes through Core.

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <future>
#include <memory>
#include <string>
#include <thread>

#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/server/core.h"

namespace cxxlaunch::rendezvous::server {

// Join runs on gRPC's completion-queue API, the other calls on its callback API: a join's events
// are handled on one thread of ours rather than handed from gRPC's poller to its callback
// threads (at 65,536 waiting nodes, 129 instead of 168 us of the daemon's CPU per node). Each
// open call still keeps one tag on the queue (gRPC's own op that watches for the call's end),
// which Debian's gRPC, built without NDEBUG, checks linearly at every completion. Join is a raw
// method (bytes in, bytes out) so that an undecodable request is answered with
// INVALID_ARGUMENT, as the proto promises.
using RendezvousBase = rdzv::Rendezvous::WithCallbackMethod_KeepAlive<
    rdzv::Rendezvous::WithCallbackMethod_RequestRestart<
        rdzv::Rendezvous::WithCallbackMethod_Leave<rdzv::Rendezvous::WithCallbackMethod_Status<
            rdzv::Rendezvous::WithRawMethod_Join<rdzv::Rendezvous::Service>>>>>;

// The joins' completion queue and the thread that serves it. Calls are requested, and answered
// at once, on that thread. A parked join is answered by whichever thread moves its round, and
// Core::stop answers those left before the queue closes.
class Joins {
 public:
  // Its thread starts here, before anything of gRPC: in a process that may start no more
  // threads this fails at once, where gRPC, once initialised, would hang in its shutdown
  // waiting for threads it could not start.
  Joins(Core& core, RendezvousBase& service)
      : core_(core), service_(service), thread_([this] { serve(); }) {}
  ~Joins() { close(); }
  Joins(const Joins&) = delete;
  Joins& operator=(const Joins&) = delete;

  void addTo(grpc::ServerBuilder& builder) { queue_ = builder.AddCompletionQueue(); }
  // Once the server has started: the thread takes calls from here on.
  void accept() {
    ready_.set_value(queue_.get());
    accepting_ = true;
  }
  // After the server's shutdown: the thread closes the queue, drains it and ends.
  void close();

  Core& core() { return core_; }
  RendezvousBase& service() { return service_; }
  grpc::ServerCompletionQueue* queue() { return queue_.get(); }
  bool closing() const { return closing_; }  // on the queue's thread only

 private:
  void serve();

  Core& core_;
  RendezvousBase& service_;
  std::unique_ptr<grpc::ServerCompletionQueue> queue_;
  // The queue once the server has started, or nullptr: it never will. Every JoinCall is made,
  // served and freed on the thread, so that what gRPC hands between threads stays on one.
  std::promise<grpc::ServerCompletionQueue*> ready_;
  bool accepting_ = false;
  std::unique_ptr<grpc::Alarm> close_alarm_;  // made by close(): no gRPC object before the thread
  bool closing_ = false;
  std::thread thread_;  // last: it starts once the rest is made
};

class RendezvousService final : public RendezvousBase {
 public:
  explicit RendezvousService(Core& core) : core_(core) {}

  grpc::ServerUnaryReactor* KeepAlive(grpc::CallbackServerContext* ctx,
                                      const rdzv::KeepAliveRequest* req,
                                      rdzv::KeepAliveResponse* resp) override;

  grpc::ServerUnaryReactor* RequestRestart(grpc::CallbackServerContext* ctx,
                                           const rdzv::RestartRequest* req,
                                           rdzv::KeepAliveResponse* resp) override;

  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const rdzv::LeaveRequest* req,
                                  rdzv::KeepAliveResponse* resp) override;

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx, const rdzv::StatusRequest* req,
                                   rdzv::StatusResponse* resp) override;

 private:
  Core& core_;
};

// What a client that sent an undecodable request to `method` is told (INVALID_ARGUMENT).
std::string undecodableMessage(const std::string& method);

}  // namespace cxxlaunch::rendezvous::server
