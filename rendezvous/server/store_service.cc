#include "rendezvous/server/store_service.h"

namespace cxxlaunch::rendezvous::server {

namespace {

std::string describeMissing(const std::vector<std::string>& keys, MemoryStore& store, Millis wait) {
  for (const auto& key : keys) {
    if (!store.check({key})) {
      return "key '" + key + "' did not appear within " + std::to_string(wait.count()) + " ms";
    }
  }
  return "timed out";
}

}  // namespace

Millis StoreService::safeWait(int64_t timeout_ms) const {
  return timeout_ms < 0 ? Millis(0) : std::min(Millis(timeout_ms), core_.options().max_wait);
}

grpc::Status StoreService::prepare(const rdzv::Scope& scope, int64_t timeout_ms) {
  waitTime(timeout_ms, core_.options().max_wait);  // rejects negative timeouts
  core_.storeOf(scope);
  return grpc::Status::OK;
}

template <typename Fill>
grpc::ServerUnaryReactor* StoreService::waitForKeys(grpc::CallbackServerContext* ctx,
                                                    const rdzv::KeysRequest* req, Fill fill) {
  const Millis wait = safeWait(req->timeout_ms());
  return core_.parkReactor(
      ctx, req->scope().run_id(), keysOf(*req),
      [&] { return prepare(req->scope(), req->timeout_ms()); }, wait,
      [this, req, wait, fill](bool expired) -> std::optional<grpc::Status> {
        MemoryStore& store = core_.storeOf(req->scope());
        const auto keys = keysOf(*req);
        if (store.check(keys)) {
          fill(store);
          return grpc::Status::OK;
        }
        if (expired) {
          return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                              describeMissing(keys, store, wait));
        }
        return std::nullopt;
      });
}

grpc::ServerUnaryReactor* StoreService::Set(grpc::CallbackServerContext* ctx,
                                            const rdzv::SetRequest* req, rdzv::SetResponse*) {
  return core_.answer(ctx, req->scope().run_id(), [&] {
    core_.storeOf(req->scope(), {req->key()}).set(req->key(), req->value());
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* StoreService::Get(grpc::CallbackServerContext* ctx,
                                            const rdzv::GetRequest* req, rdzv::GetResponse* resp) {
  const Millis wait = safeWait(req->timeout_ms());
  return core_.parkReactor(
      ctx, req->scope().run_id(), {req->key()},
      [&] { return prepare(req->scope(), req->timeout_ms()); }, wait,
      [this, req, resp, wait](bool expired) -> std::optional<grpc::Status> {
        MemoryStore& store = core_.storeOf(req->scope());
        if (store.check({req->key()})) {
          resp->set_value(store.get(req->key(), Millis(0)));
          return grpc::Status::OK;
        }
        if (expired) {
          return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                              describeMissing({req->key()}, store, wait));
        }
        return std::nullopt;
      });
}

grpc::ServerUnaryReactor* StoreService::Add(grpc::CallbackServerContext* ctx,
                                            const rdzv::AddRequest* req, rdzv::AddResponse* resp) {
  return core_.answer(ctx, req->scope().run_id(), [&] {
    resp->set_value(core_.storeOf(req->scope(), {req->key()}).add(req->key(), req->delta()));
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* StoreService::CompareSet(grpc::CallbackServerContext* ctx,
                                                   const rdzv::CompareSetRequest* req,
                                                   rdzv::CompareSetResponse* resp) {
  return core_.answer(ctx, req->scope().run_id(), [&] {
    resp->set_value(core_.storeOf(req->scope(), {req->key()})
                        .compareSet(req->key(), req->expected(), req->desired()));
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* StoreService::Wait(grpc::CallbackServerContext* ctx,
                                             const rdzv::KeysRequest* req, rdzv::WaitResponse*) {
  return waitForKeys(ctx, req, [](MemoryStore&) {});
}

grpc::ServerUnaryReactor* StoreService::Check(grpc::CallbackServerContext* ctx,
                                              const rdzv::KeysRequest* req,
                                              rdzv::CheckResponse* resp) {
  return core_.answer(ctx, req->scope().run_id(), [&] {
    resp->set_ready(core_.storeOf(req->scope()).check(keysOf(*req)));
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* StoreService::Delete(grpc::CallbackServerContext* ctx,
                                               const rdzv::DeleteRequest* req,
                                               rdzv::DeleteResponse* resp) {
  return core_.answer(ctx, req->scope().run_id(), [&] {
    resp->set_existed(core_.storeOf(req->scope()).deleteKey(req->key()));
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* StoreService::NumKeys(grpc::CallbackServerContext* ctx,
                                                const rdzv::NumKeysRequest* req,
                                                rdzv::NumKeysResponse* resp) {
  return core_.answer(ctx, req->scope().run_id(), [&] {
    resp->set_count(core_.storeOf(req->scope()).numKeys());
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* StoreService::MultiGet(grpc::CallbackServerContext* ctx,
                                                 const rdzv::KeysRequest* req,
                                                 rdzv::MultiGetResponse* resp) {
  const int64_t max_bytes = core_.options().max_message_bytes;
  return waitForKeys(ctx, req, [req, resp, max_bytes](MemoryStore& store) {
    resp->clear_values();
    for (const auto& value : store.multiGet(keysOf(*req), Millis(0))) resp->add_values(value);
    // gRPC would refuse to send it with a message about itself; say what to do instead.
    if (static_cast<int64_t>(resp->ByteSizeLong()) > max_bytes) {
      const auto size = resp->ByteSizeLong();
      resp->clear_values();
      throw LimitExceeded("multi_get: the answer would be " + std::to_string(size) +
                          " bytes, more than the message limit of " + std::to_string(max_bytes) +
                          " (cxxlaunchd --max-message-bytes); get fewer keys at a time");
    }
  });
}

grpc::ServerUnaryReactor* StoreService::MultiSet(grpc::CallbackServerContext* ctx,
                                                 const rdzv::MultiSetRequest* req,
                                                 rdzv::MultiSetResponse*) {
  return core_.answer(ctx, req->scope().run_id(), [&] {
    std::vector<std::string> values(req->values().begin(), req->values().end());
    const auto keys = keysOf(*req);
    core_.storeOf(req->scope(), keys).multiSet(keys, values);
    return grpc::Status::OK;
  });
}

}  // namespace cxxlaunch::rendezvous::server
