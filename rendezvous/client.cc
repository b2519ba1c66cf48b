#include "rendezvous/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/endpoint_probe.h"
#include "rendezvous/wire.h"

namespace cxxlaunch::rendezvous {
namespace {

// Every call: the token, and a deadline.
void prepare(grpc::ClientContext& ctx, const ClientOptions& options, Millis timeout) {
  if (!options.token.empty()) ctx.AddMetadata(wire::kTokenHeader, options.token);
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
}

// A call that failed without ever reaching the server says only "Deadline Exceeded" or "failed
// to connect": add what the user can check, above all the TLS settings, whose handshake failures
// gRPC does not surface to the caller.
grpc::Status explainUnreachable(const grpc::Status& status, grpc::Channel& channel,
                                const ClientOptions& options) {
  const auto code = status.error_code();
  if (code != grpc::StatusCode::DEADLINE_EXCEEDED && code != grpc::StatusCode::UNAVAILABLE) {
    return status;
  }
  if (channel.GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY) return status;
  std::string hint = "could not connect to " + options.endpoint + " (" + status.error_message() +
                     "): check that the server is up and reachable";
  if (options.tls_ca_file.empty()) {
    hint += "; if it serves TLS, give its CA (--rdzv_conf tls_ca=FILE)";
  } else {
    hint += ", that " + options.tls_ca_file + " signed its certificate for this host name";
    if (options.tls_cert_file.empty()) {
      hint +=
          ", and, since no client certificate is given, that it does not require one: a "
          "server started with --tls-ca refuses clients without tls_cert and tls_key";
    } else {
      hint += ", and that its --tls-ca signed " + options.tls_cert_file;
    }
  }
  return {code, hint};
}

}  // namespace

std::shared_ptr<grpc::Channel> makeChannel(const ClientOptions& options) {
  wire::quietGrpcLogs();
  const auto credentials =
      wire::clientCredentials(options.tls_ca_file, options.tls_cert_file, options.tls_key_file);
  grpc::ChannelArguments args;
  // The server bounds what it sends (its max_message_bytes, 64 MiB by default, above its largest
  // value); the client's own bound only guards against a broken server, so it is larger.
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(options.endpoint, credentials, args);
}

std::string storePrefix(const std::string& run_id, int64_t round) {
  return run_id + "/" + std::to_string(round);
}

std::pair<std::string, int64_t> parseStorePrefix(const std::string& prefix) {
  auto slash = prefix.rfind('/');
  if (slash == std::string::npos || slash == 0) {
    throw InvalidArgument("store prefix '" + prefix + "' is not RUN_ID/ROUND");
  }
  return {prefix.substr(0, slash), std::atoll(prefix.c_str() + slash + 1)};
}

// ---- GrpcStore --------------------------------------------------------------------------------

struct GrpcStore::Impl {
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<rdzv::Store::Stub> stub;
  rdzv::Scope scope;

  // Until a call has got through, calls wait for the server to come up (within their deadline)
  // instead of failing at once: a launcher's own server starts gRPC when its first client
  // connects, and may reset a connection while it does (rendezvous/server.h,
  // start_on_first_connection). Where nothing accepts connections at all (a wrong endpoint, a
  // server that is gone) the call fails at once; so does any call once one got through.
  std::atomic<bool> reached{false};

  bool somethingListens() const {
    try {
      const Millis timeout = std::min(options.call_timeout, Millis(std::chrono::seconds(2)));
      return probeEndpoint(options.endpoint, timeout).kind != EndpointAnswer::Kind::kNothing;
    } catch (const InvalidArgument&) {
      return true;  // an endpoint the probe cannot read (gRPC's own forms): let gRPC wait
    }
  }

  template <typename Call>
  void call(const char* what, Millis timeout, Call&& rpc) {
    grpc::ClientContext ctx;
    prepare(ctx, options, timeout);
    ctx.set_wait_for_ready(!reached && somethingListens());
    const grpc::Status status = rpc(ctx);
    if (status.ok() || channel->GetState(false) == GRPC_CHANNEL_READY) reached = true;
    wire::throwIfError(explainUnreachable(status, *channel, options), std::string("store ") + what);
  }
  // Blocking calls get the server-side wait plus the usual margin.
  Millis blocking(Timeout timeout) const { return timeout + options.call_timeout; }
};

GrpcStore::GrpcStore(const ClientOptions& options, std::string run_id, int64_t round)
    : impl_(std::make_shared<Impl>()) {
  impl_->options = options;
  impl_->channel = makeChannel(options);
  impl_->stub = rdzv::Store::NewStub(impl_->channel);
  impl_->scope.set_run_id(std::move(run_id));
  impl_->scope.set_round(round);
}

void GrpcStore::set(const std::string& key, const std::string& value) {
  rdzv::SetRequest req;
  *req.mutable_scope() = impl_->scope;
  req.set_key(key);
  req.set_value(value);
  rdzv::SetResponse resp;
  impl_->call("set", impl_->options.call_timeout,
              [&](grpc::ClientContext& ctx) { return impl_->stub->Set(&ctx, req, &resp); });
}

std::string GrpcStore::get(const std::string& key, Timeout timeout) {
  rdzv::GetRequest req;
  *req.mutable_scope() = impl_->scope;
  req.set_key(key);
  req.set_timeout_ms(timeout.count());
  rdzv::GetResponse resp;
  impl_->call("get", impl_->blocking(timeout),
              [&](grpc::ClientContext& ctx) { return impl_->stub->Get(&ctx, req, &resp); });
  return resp.value();
}

int64_t GrpcStore::add(const std::string& key, int64_t delta) {
  rdzv::AddRequest req;
  *req.mutable_scope() = impl_->scope;
  req.set_key(key);
  req.set_delta(delta);
  rdzv::AddResponse resp;
  impl_->call("add", impl_->options.call_timeout,
              [&](grpc::ClientContext& ctx) { return impl_->stub->Add(&ctx, req, &resp); });
  return resp.value();
}

std::string GrpcStore::compareSet(const std::string& key, const std::string& expected,
                                  const std::string& desired) {
  rdzv::CompareSetRequest req;
  *req.mutable_scope() = impl_->scope;
  req.set_key(key);
  req.set_expected(expected);
  req.set_desired(desired);
  rdzv::CompareSetResponse resp;
  impl_->call("compare_set", impl_->options.call_timeout,
              [&](grpc::ClientContext& ctx) { return impl_->stub->CompareSet(&ctx, req, &resp); });
  return resp.value();
}

void GrpcStore::wait(const std::vector<std::string>& keys, Timeout timeout) {
  rdzv::KeysRequest req;
  *req.mutable_scope() = impl_->scope;
  for (const auto& key : keys) req.add_keys(key);
  req.set_timeout_ms(timeout.count());
  rdzv::WaitResponse resp;
  impl_->call("wait", impl_->blocking(timeout),
              [&](grpc::ClientContext& ctx) { return impl_->stub->Wait(&ctx, req, &resp); });
}

bool GrpcStore::check(const std::vector<std::string>& keys) {
  rdzv::KeysRequest req;
  *req.mutable_scope() = impl_->scope;
  for (const auto& key : keys) req.add_keys(key);
  rdzv::CheckResponse resp;
  impl_->call("check", impl_->options.call_timeout,
              [&](grpc::ClientContext& ctx) { return impl_->stub->Check(&ctx, req, &resp); });
  return resp.ready();
}

bool GrpcStore::deleteKey(const std::string& key) {
  rdzv::DeleteRequest req;
  *req.mutable_scope() = impl_->scope;
  req.set_key(key);
  rdzv::DeleteResponse resp;
  impl_->call("delete", impl_->options.call_timeout,
              [&](grpc::ClientContext& ctx) { return impl_->stub->Delete(&ctx, req, &resp); });
  return resp.existed();
}

int64_t GrpcStore::numKeys() {
  rdzv::NumKeysRequest req;
  *req.mutable_scope() = impl_->scope;
  rdzv::NumKeysResponse resp;
  impl_->call("num_keys", impl_->options.call_timeout,
              [&](grpc::ClientContext& ctx) { return impl_->stub->NumKeys(&ctx, req, &resp); });
  return resp.count();
}

std::vector<std::string> GrpcStore::multiGet(const std::vector<std::string>& keys,
                                             Timeout timeout) {
  rdzv::KeysRequest req;
  *req.mutable_scope() = impl_->scope;
  for (const auto& key : keys) req.add_keys(key);
  req.set_timeout_ms(timeout.count());
  rdzv::MultiGetResponse resp;
  impl_->call("multi_get", impl_->blocking(timeout),
              [&](grpc::ClientContext& ctx) { return impl_->stub->MultiGet(&ctx, req, &resp); });
  return {resp.values().begin(), resp.values().end()};
}

void GrpcStore::multiSet(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values) {
  rdzv::MultiSetRequest req;
  *req.mutable_scope() = impl_->scope;
  for (const auto& key : keys) req.add_keys(key);
  for (const auto& value : values) req.add_values(value);
  rdzv::MultiSetResponse resp;
  impl_->call("multi_set", impl_->options.call_timeout,
              [&](grpc::ClientContext& ctx) { return impl_->stub->MultiSet(&ctx, req, &resp); });
}

// ---- RendezvousClient -------------------------------------------------------------------------

struct RendezvousClient::Impl {
  ClientOptions options;
  std::string run_id;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<rdzv::Rendezvous::Stub> stub;
  std::mutex mu;
  grpc::ClientContext* joining = nullptr;  // the join in progress, for cancel()
  bool cancelled = false;
  // Until a server has answered a join: look at what holds the endpoint first.
  bool probe = false;

  // An endpoint that answers but not as a gRPC server is an error now (InvalidArgument: the
  // endpoint is the user's to fix), not a wait for a server that cannot come there. Nothing
  // listening goes on to the join, which waits for the server; a connection that stays silent
  // (or is closed at once) is a CommunicationError, retried until the join timeout: a stopped
  // server, or a port forward with nothing behind it yet, looks the same.
  void checkEndpoint() {
    const Millis timeout = std::min(options.call_timeout, kProbeTimeout);
    const EndpointAnswer answer = probeEndpoint(options.endpoint, timeout);
    const std::string said = " (it answered: \"" + printableBytes(answer.first_bytes) + "\")";
    switch (answer.kind) {
      case EndpointAnswer::Kind::kNothing:
      case EndpointAnswer::Kind::kHttp2:
        return;
      case EndpointAnswer::Kind::kTls:
        throw InvalidArgument(options.endpoint +
                              " answered with TLS: give its CA (--rdzv_conf tls_ca=FILE)" + said);
      case EndpointAnswer::Kind::kSilent:
        throw CommunicationError(options.endpoint +
                                 " accepted the connection but sent nothing back within " +
                                 std::to_string(timeout.count()) +
                                 " ms (a stopped server; a TLS server, then give its CA with "
                                 "--rdzv_conf tls_ca=FILE; or not a cxxlaunch rendezvous "
                                 "server)");
      case EndpointAnswer::Kind::kOther:
        throw InvalidArgument(options.endpoint +
                              " answered but is not a cxxlaunch rendezvous server: it did not "
                              "speak HTTP/2 (gRPC)" +
                              said + "; check --rdzv_endpoint");
    }
  }
  static constexpr Millis kProbeTimeout = std::chrono::seconds(2);

  template <typename Response, typename Call>
  Response unary(const char* what, Call&& rpc, Millis timeout = Millis(0)) {
    grpc::ClientContext ctx;
    prepare(ctx, options,
            timeout.count() > 0 ? std::min(timeout, options.call_timeout) : options.call_timeout);
    Response resp;
    wire::throwIfError(explainUnreachable(rpc(ctx, resp), *channel, options),
                       std::string("rendezvous ") + what + " at " + options.endpoint);
    return resp;
  }
};

RendezvousClient::RendezvousClient(const ClientOptions& options, std::string run_id)
    : RendezvousClient(options, std::move(run_id), makeChannel(options)) {
  // Only our own channel goes where options.endpoint says; with TLS the server speaks only after
  // our handshake, so the probe could tell nothing.
  impl_->probe = !options.endpoint.empty() && options.tls_ca_file.empty();
}

RendezvousClient::RendezvousClient(const ClientOptions& options, std::string run_id,
                                   std::shared_ptr<grpc::Channel> channel)
    : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
  impl_->run_id = std::move(run_id);
  impl_->channel = std::move(channel);
  impl_->stub = rdzv::Rendezvous::NewStub(impl_->channel);
}

RendezvousClient::~RendezvousClient() = default;

JoinPoll RendezvousClient::join(const NodeSpec& node, const RunSettings& settings, Millis poll) {
  rdzv::JoinRequest req;
  req.set_run_id(impl_->run_id);
  wire::toProto(node, req.mutable_node());
  wire::toProto(settings, req.mutable_settings());
  req.set_poll_ms(poll.count());
  if (impl_->probe) impl_->checkEndpoint();
  rdzv::JoinResponse resp;
  grpc::ClientContext ctx;
  prepare(ctx, impl_->options, poll + impl_->options.call_timeout);
  ctx.set_wait_for_ready(true);  // the server may not be up yet
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->cancelled) throw CommunicationError("rendezvous join cancelled");
    impl_->joining = &ctx;
  }
  grpc::Status status = impl_->stub->Join(&ctx, req, &resp);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->joining = nullptr;
  }
  if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    // An HTTP/2 server without our service: another gRPC server (etcd's, say).
    const std::string said = status.error_message().empty() ? "" : ": " + status.error_message();
    throw InvalidArgument(impl_->options.endpoint +
                          " answered but is not a cxxlaunch rendezvous server (it answered "
                          "UNIMPLEMENTED" +
                          said + "); check --rdzv_endpoint");
  }
  if (status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED &&
      status.error_code() != grpc::StatusCode::UNAVAILABLE) {
    impl_->probe = false;  // a rendezvous server answered
  }
  wire::throwIfError(explainUnreachable(status, *impl_->channel, impl_->options),
                     "rendezvous join at " + impl_->options.endpoint);
  JoinPoll result;
  if (resp.complete()) {
    result.placement = wire::fromProto(resp.round());
  } else {
    result.waiting_for = resp.waiting_for();
  }
  return result;
}

void RendezvousClient::cancel() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->cancelled = true;
  if (impl_->joining != nullptr) impl_->joining->TryCancel();
}

Verdict RendezvousClient::keepAlive(const std::string& node_id, int64_t round, Millis timeout,
                                    const std::vector<WorkerProgress>& workers) {
  rdzv::KeepAliveRequest req;
  req.set_run_id(impl_->run_id);
  req.set_node_id(node_id);
  req.set_round(round);
  for (const auto& w : workers) wire::toProto(w, req.add_workers());
  return wire::fromProto(impl_->unary<rdzv::KeepAliveResponse>(
      "keep-alive",
      [&](grpc::ClientContext& ctx, auto& resp) {
        return impl_->stub->KeepAlive(&ctx, req, &resp);
      },
      timeout));
}

Verdict RendezvousClient::requestRestart(const std::string& node_id, int64_t round,
                                         const FailureReport& failure) {
  rdzv::RestartRequest req;
  req.set_run_id(impl_->run_id);
  req.set_node_id(node_id);
  req.set_round(round);
  wire::toProto(failure, req.mutable_failure());
  return wire::fromProto(impl_->unary<rdzv::KeepAliveResponse>(
      "restart request", [&](grpc::ClientContext& ctx, auto& resp) {
        return impl_->stub->RequestRestart(&ctx, req, &resp);
      }));
}

Verdict RendezvousClient::leave(const std::string& node_id, int64_t round) {
  rdzv::LeaveRequest req;
  req.set_run_id(impl_->run_id);
  req.set_node_id(node_id);
  req.set_round(round);
  return wire::fromProto(impl_->unary<rdzv::KeepAliveResponse>(
      "leave",
      [&](grpc::ClientContext& ctx, auto& resp) { return impl_->stub->Leave(&ctx, req, &resp); }));
}

RunStatus RendezvousClient::status() {
  rdzv::StatusRequest req;
  req.set_run_id(impl_->run_id);
  return wire::fromProto(impl_->unary<rdzv::StatusResponse>(
      "status",
      [&](grpc::ClientContext& ctx, auto& resp) { return impl_->stub->Status(&ctx, req, &resp); }));
}

}  // namespace cxxlaunch::rendezvous
