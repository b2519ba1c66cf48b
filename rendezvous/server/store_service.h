#pragma once
// The Store service of proto/rendezvous.proto on gRPC's callback API: the key space of a run's
// current round, with blocking gets and waits parked in Core until their keys are written.

#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/server/core.h"

namespace cxxlaunch::rendezvous::server {

class StoreService final : public rdzv::Store::CallbackService {
 public:
  explicit StoreService(Core& core) : core_(core) {}

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* ctx, const rdzv::SetRequest* req,
                                rdzv::SetResponse*) override;

  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const rdzv::GetRequest* req,
                                rdzv::GetResponse* resp) override;

  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* ctx, const rdzv::AddRequest* req,
                                rdzv::AddResponse* resp) override;

  grpc::ServerUnaryReactor* CompareSet(grpc::CallbackServerContext* ctx,
                                       const rdzv::CompareSetRequest* req,
                                       rdzv::CompareSetResponse* resp) override;

  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx, const rdzv::KeysRequest* req,
                                 rdzv::WaitResponse*) override;

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* ctx, const rdzv::KeysRequest* req,
                                  rdzv::CheckResponse* resp) override;

  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* ctx, const rdzv::DeleteRequest* req,
                                   rdzv::DeleteResponse* resp) override;

  grpc::ServerUnaryReactor* NumKeys(grpc::CallbackServerContext* ctx,
                                    const rdzv::NumKeysRequest* req,
                                    rdzv::NumKeysResponse* resp) override;

  grpc::ServerUnaryReactor* MultiGet(grpc::CallbackServerContext* ctx, const rdzv::KeysRequest* req,
                                     rdzv::MultiGetResponse* resp) override;

  grpc::ServerUnaryReactor* MultiSet(grpc::CallbackServerContext* ctx,
                                     const rdzv::MultiSetRequest* req,
                                     rdzv::MultiSetResponse*) override;

 private:
  template <typename Request>
  static std::vector<std::string> keysOf(const Request& req) {
    return {req.keys().begin(), req.keys().end()};
  }

  Millis safeWait(int64_t timeout_ms) const;

  grpc::Status prepare(const rdzv::Scope& scope, int64_t timeout_ms);

  template <typename Fill>
  grpc::ServerUnaryReactor* waitForKeys(grpc::CallbackServerContext* ctx,
                                        const rdzv::KeysRequest* req, Fill fill);

  Core& core_;
};

}  // namespace cxxlaunch::rendezvous::server
