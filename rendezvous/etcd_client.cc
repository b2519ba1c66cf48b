#include "rendezvous/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "common/error.h"
#include "common/host.h"
#include "proto/etcd.grpc.pb.h"
#include "rendezvous/wire.h"

namespace cxxlaunch::rendezvous {
namespace pb = ::etcdserverpb;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

// The metadata key that carries etcd's auth token.
constexpr char kTokenKey[] = "token";

pb::Compare toProto(const EtcdCompare& c) {
  pb::Compare p;
  p.set_key(c.key);
  switch (c.result) {
    case EtcdCompare::Result::kEqual:
      p.set_result(pb::Compare::EQUAL);
      break;
    case EtcdCompare::Result::kGreater:
      p.set_result(pb::Compare::GREATER);
      break;
    case EtcdCompare::Result::kLess:
      p.set_result(pb::Compare::LESS);
      break;
    case EtcdCompare::Result::kNotEqual:
      p.set_result(pb::Compare::NOT_EQUAL);
      break;
  }
  switch (c.target) {
    case EtcdCompare::Target::kVersion:
      p.set_target(pb::Compare::VERSION);
      p.set_version(c.number);
      break;
    case EtcdCompare::Target::kCreate:
      p.set_target(pb::Compare::CREATE);
      p.set_create_revision(c.number);
      break;
    case EtcdCompare::Target::kMod:
      p.set_target(pb::Compare::MOD);
      p.set_mod_revision(c.number);
      break;
    case EtcdCompare::Target::kValue:
      p.set_target(pb::Compare::VALUE);
      p.set_value(c.value);
      break;
  }
  return p;
}

pb::RangeRequest rangeOf(const EtcdOp& op) {
  pb::RangeRequest r;
  r.set_key(op.key);
  if (!op.range_end.empty()) r.set_range_end(op.range_end);
  r.set_count_only(op.count_only);
  r.set_keys_only(op.keys_only);
  r.set_limit(op.limit);
  return r;
}

void toProto(const EtcdOp& op, pb::RequestOp* p) {
  switch (op.kind) {
    case EtcdOp::Kind::kRange:
      *p->mutable_request_range() = rangeOf(op);
      break;
    case EtcdOp::Kind::kPut: {
      auto* put = p->mutable_request_put();
      put->set_key(op.key);
      put->set_value(op.value);
      put->set_lease(op.lease);
      break;
    }
    case EtcdOp::Kind::kDelete: {
      auto* del = p->mutable_request_delete_range();
      del->set_key(op.key);
      if (!op.range_end.empty()) del->set_range_end(op.range_end);
      break;
    }
  }
}

EtcdKeyValue fromProto(const pb::KeyValue& kv) {
  return {kv.key(), kv.value(), kv.create_revision(), kv.mod_revision(), kv.version(), kv.lease()};
}

EtcdOpResult fromProto(const pb::RangeResponse& r) {
  EtcdOpResult out;
  out.count = r.count();
  for (const auto& kv : r.kvs()) out.kvs.push_back(fromProto(kv));
  return out;
}

EtcdOpResult fromProto(const pb::ResponseOp& r) {
  if (r.has_response_range()) return fromProto(r.response_range());
  EtcdOpResult out;
  if (r.has_response_delete_range()) out.deleted = r.response_delete_range().deleted();
  return out;
}

// gRPC takes deadlines on the system clock; ours are on the steady one.
std::chrono::system_clock::time_point grpcDeadline(Clock::time_point deadline) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(deadline - Clock::now());
}

bool contains(const std::string& text, const char* what) {
  return text.find(what) != std::string::npos;
}

// etcd's answers that mean "authenticate (again)": a token it no longer knows (simple tokens
// live in memory and die with a restart, JWTs expire) or none given.
bool needsToken(const grpc::Status& s) {
  const std::string& m = s.error_message();
  return contains(m, "invalid auth token") || contains(m, "auth token is expired") ||
         contains(m, "user name is empty");
}

bool unreachable(const grpc::Status& s, grpc::Channel& channel) {
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) return true;
  // A deadline that ran out before a connection was made: the member is as good as down.
  return s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
         channel.GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY;
}

}  // namespace

// ---- EtcdClient -------------------------------------------------------------------------------

struct EtcdClient::Impl {
  struct Member {
    std::string endpoint;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<pb::KV::Stub> kv;
    std::unique_ptr<pb::Lease::Stub> lease;
    std::unique_ptr<pb::Watch::Stub> watch;
    std::unique_ptr<pb::Auth::Stub> auth;
  };

  EtcdOptions options;
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  grpc::ChannelArguments args;
  std::mutex members_mu;
  std::vector<std::shared_ptr<Member>> members;  // under members_mu (the pointers)
  std::vector<Clock::time_point> made;           // when each member's channel was made
  std::atomic<size_t> current{0};
  std::mutex auth_mu;
  std::string token;  // under auth_mu; empty: not authenticated (yet)
  std::mutex calls_mu;
  std::set<grpc::ClientContext*> calls;  // in flight, for cancelCalls()
  std::multimap<const std::atomic<bool>*, grpc::ClientContext*> waits;  // for cancelWaits()

  // Registers a call in flight while it lives.
  class InFlight {
   public:
    InFlight(Impl& impl, grpc::ClientContext& ctx) : impl_(impl), ctx_(ctx) {
      std::lock_guard<std::mutex> lock(impl_.calls_mu);
      impl_.calls.insert(&ctx_);
    }
    ~InFlight() {
      std::lock_guard<std::mutex> lock(impl_.calls_mu);
      impl_.calls.erase(&ctx_);
    }
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;

   private:
    Impl& impl_;
    grpc::ClientContext& ctx_;
  };
  std::string list;

  explicit Impl(EtcdOptions o) : options(std::move(o)) {
    if (options.endpoints.empty()) throw InvalidArgument("no etcd endpoint given");
    wire::quietGrpcLogs();
    credentials =
        wire::clientCredentials(options.tls_ca_file, options.tls_cert_file, options.tls_key_file);
    args.SetMaxReceiveMessageSize(64 << 20);
    // A restarted member is found again within a second, not after gRPC's default 2 min cap.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    for (const auto& endpoint : options.endpoints) {
      members.push_back(makeMember(endpoint));
      made.push_back(Clock::now());
      list += (list.empty() ? "" : ",") + endpoint;
    }
  }

  std::shared_ptr<Member> makeMember(const std::string& endpoint) {
    auto m = std::make_shared<Member>();
    m->endpoint = endpoint;
    m->channel = grpc::CreateCustomChannel(endpoint, credentials, args);
    m->kv = pb::KV::NewStub(m->channel);
    m->lease = pb::Lease::NewStub(m->channel);
    m->watch = pb::Watch::NewStub(m->channel);
    m->auth = pb::Auth::NewStub(m->channel);
    return m;
  }

  std::shared_ptr<Member> member(size_t at) {
    std::lock_guard<std::mutex> lock(members_mu);
    return members[at];
  }

  // A member found unreachable gets a fresh channel (at most every 200 ms): gRPC's channel,
  // once it failed to connect, can sit in TRANSIENT_FAILURE for seconds after the member is back
  // (fail-fast calls do not make it try again), and a restarted etcd must be found at once.
  void renew(size_t at, const std::shared_ptr<Member>& seen) {
    std::lock_guard<std::mutex> lock(members_mu);
    if (members[at] != seen || Clock::now() - made[at] < milliseconds(200)) return;
    members[at] = makeMember(seen->endpoint);
    made[at] = Clock::now();
  }

  // The token to send, authenticating first when a user is given and there is none yet.
  std::string tokenFor(Member& m, Clock::time_point deadline) {
    if (options.user.empty()) return "";
    std::lock_guard<std::mutex> lock(auth_mu);
    if (!token.empty()) return token;
    grpc::ClientContext ctx;
    ctx.set_deadline(grpcDeadline(deadline));
    pb::AuthenticateRequest req;
    req.set_name(options.user);
    req.set_password(options.password);
    pb::AuthenticateResponse resp;
    const grpc::Status s = m.auth->Authenticate(&ctx, req, &resp);
    if (s.ok()) {
      token = resp.token();
      return token;
    }
    if (contains(s.error_message(), "authentication is not enabled")) return "";
    if (unreachable(s, *m.channel)) wire::throwIfError(s, "etcd at " + m.endpoint);
    throw InvalidArgument("etcd at " + m.endpoint + " refused user '" + options.user +
                          "': " + s.error_message() +
                          " (check --rdzv_conf user= and password= or password_file=)");
  }

  void forgetToken(const std::string& stale) {
    std::lock_guard<std::mutex> lock(auth_mu);
    if (token == stale) token.clear();
  }

  [[noreturn]] void fail(const grpc::Status& s, const std::string& what, const Member& m) {
    std::string message = "etcd " + what + " at " + m.endpoint + ": " + s.error_message();
    if (options.user.empty() && (contains(s.error_message(), "user name is empty") ||
                                 contains(s.error_message(), "permission denied"))) {
      message += " (this etcd requires auth: --rdzv_conf user=NAME,password_file=FILE)";
    }
    if (contains(s.error_message(), "too large") ||
        contains(s.error_message(), "larger than max")) {
      throw LimitExceeded(message +
                          " (etcd refuses requests over its --max-request-bytes, 1.5 MiB "
                          "by default)");
    }
    switch (s.error_code()) {
      case grpc::StatusCode::INVALID_ARGUMENT:
      case grpc::StatusCode::UNAUTHENTICATED:
      case grpc::StatusCode::PERMISSION_DENIED:
        throw InvalidArgument(message);
      case grpc::StatusCode::RESOURCE_EXHAUSTED:
        throw LimitExceeded(message);
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        throw TimeoutError(message);
      default:
        throw CommunicationError(message);
    }
  }

  // Runs `rpc(member, ctx)` on the current member, and on the next ones while they are
  // unreachable. The deadline is per attempt.
  template <typename Rpc>
  void call(const std::string& what, Rpc&& rpc, milliseconds timeout = milliseconds(0)) {
    if (timeout.count() <= 0) timeout = options.call_timeout;
    const size_t n = members.size();
    const size_t start = current.load();
    std::string last;
    for (size_t i = 0; i < n; ++i) {
      const size_t at = (start + i) % n;
      const std::shared_ptr<Member> held = member(at);
      Member& m = *held;
      grpc::Status s;
      for (int attempt = 0; attempt < 2; ++attempt) {
        const auto deadline = Clock::now() + timeout;
        std::string tok;
        try {
          tok = tokenFor(m, deadline);
        } catch (const CommunicationError& e) {
          last = e.what();
          s = grpc::Status(grpc::StatusCode::UNAVAILABLE, e.what());
          break;
        } catch (const TimeoutError& e) {
          last = e.what();
          s = grpc::Status(grpc::StatusCode::UNAVAILABLE, e.what());
          break;
        }
        grpc::ClientContext ctx;
        ctx.set_deadline(grpcDeadline(deadline));
        if (!tok.empty()) ctx.AddMetadata(kTokenKey, tok);
        const InFlight in_flight(*this, ctx);
        s = rpc(m, ctx);
        if (s.ok()) {
          current = at;
          return;
        }
        if (!options.user.empty() && needsToken(s) && attempt == 0) {
          forgetToken(tok);
          continue;
        }
        break;
      }
      if (unreachable(s, *m.channel)) {
        last = m.endpoint + ": " + s.error_message();
        renew(at, held);
        continue;
      }
      fail(s, what, m);
    }
    current = (start + 1) % n;
    throw CommunicationError("etcd " + what + ": no member reachable at " + list + " (" + last +
                             ")");
  }
};

EtcdClient::EtcdClient(EtcdOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
EtcdClient::~EtcdClient() = default;

const EtcdOptions& EtcdClient::options() const { return impl_->options; }
std::string EtcdClient::endpointList() const { return impl_->list; }

EtcdTxnResult EtcdClient::txn(const std::vector<EtcdCompare>& compares,
                              const std::vector<EtcdOp>& success,
                              const std::vector<EtcdOp>& failure, milliseconds timeout) {
  pb::TxnRequest req;
  for (const auto& c : compares) *req.add_compare() = toProto(c);
  for (const auto& op : success) toProto(op, req.add_success());
  for (const auto& op : failure) toProto(op, req.add_failure());
  pb::TxnResponse resp;
  impl_->call(
      "transaction",
      [&](Impl::Member& m, grpc::ClientContext& ctx) { return m.kv->Txn(&ctx, req, &resp); },
      timeout);
  EtcdTxnResult out;
  out.succeeded = resp.succeeded();
  out.revision = resp.header().revision();
  for (const auto& r : resp.responses()) out.results.push_back(fromProto(r));
  return out;
}

// A transaction of one operation and no compares: the same as etcd's unary call.
EtcdOpResult EtcdClient::run(const EtcdOp& op, int64_t* revision, milliseconds timeout) {
  EtcdTxnResult r = txn({}, {op}, {}, timeout);
  if (revision) *revision = r.revision;
  return r.results.empty() ? EtcdOpResult{} : std::move(r.results[0]);
}

int64_t EtcdClient::grantLease(milliseconds ttl, std::chrono::seconds* granted) {
  pb::LeaseGrantRequest req;
  req.set_ttl(std::max<int64_t>(1, (ttl.count() + 999) / 1000));
  pb::LeaseGrantResponse resp;
  impl_->call("lease grant", [&](Impl::Member& m, grpc::ClientContext& ctx) {
    return m.lease->LeaseGrant(&ctx, req, &resp);
  });
  if (!resp.error().empty()) throw CommunicationError("etcd lease grant: " + resp.error());
  if (granted) *granted = std::chrono::seconds(resp.ttl());
  return resp.id();
}

bool EtcdClient::keepLeaseAlive(int64_t lease, milliseconds timeout) {
  pb::LeaseKeepAliveResponse resp;
  bool answered = false;
  impl_->call(
      "lease keep-alive",
      [&](Impl::Member& m, grpc::ClientContext& ctx) {
        auto stream = m.lease->LeaseKeepAlive(&ctx);
        pb::LeaseKeepAliveRequest req;
        req.set_id(lease);
        answered = stream->Write(req) && stream->Read(&resp);
        stream->WritesDone();
        if (answered) ctx.TryCancel();  // we have our answer; the stream would stay open
        const grpc::Status s = stream->Finish();
        return answered ? grpc::Status::OK
               : s.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "keep-alive stream closed")
                        : s;
      },
      timeout);
  return resp.ttl() > 0;
}

void EtcdClient::cancelCalls() {
  std::lock_guard<std::mutex> lock(impl_->calls_mu);
  for (grpc::ClientContext* ctx : impl_->calls) ctx->TryCancel();
}

void EtcdClient::cancelWaits(const std::atomic<bool>& cancel) {
  std::lock_guard<std::mutex> lock(impl_->calls_mu);
  auto [from, to] = impl_->waits.equal_range(&cancel);
  for (auto it = from; it != to; ++it) it->second->TryCancel();
}

void EtcdClient::revokeLease(int64_t lease, milliseconds timeout) {
  pb::LeaseRevokeRequest req;
  req.set_id(lease);
  pb::LeaseRevokeResponse resp;
  impl_->call(
      "lease revoke",
      [&](Impl::Member& m, grpc::ClientContext& ctx) {
        return m.lease->LeaseRevoke(&ctx, req, &resp);
      },
      timeout);
}

// 1. Open a Watch stream on the current member, from `revision` + 1 (etcd replays what happened
//    since, so nothing between the caller's read and this watch is missed).
// 2. Any event (or a compaction past our revision) -> true: the caller re-reads.
// 3. The stream lives at most one slice (10 s); on a member that is unreachable the next one is
//    tried, until `timeout`. A `cancel` flag ends the stream through cancelWaits(), not by short
//    slices: each new stream starts from `revision`, and etcd replays its history from there to
//    every watcher so started (thousands of waiting agents made that etcd's main work).
bool EtcdClient::waitForChange(const std::string& key, const std::string& range_end,
                               int64_t revision, milliseconds timeout,
                               const std::atomic<bool>* cancel) {
  const auto deadline = Clock::now() + timeout;
  const milliseconds slice = std::chrono::seconds(10);
  Impl& impl = *impl_;
  while (Clock::now() < deadline) {
    if (cancel && cancel->load()) return false;
    const size_t at = impl.current.load() % impl.members.size();
    const std::shared_ptr<Impl::Member> held = impl.member(at);
    Impl::Member& m = *held;
    const auto slice_end = std::min(deadline, Clock::now() + slice);
    std::string tok;
    try {
      tok = impl.tokenFor(m, slice_end);
    } catch (const CommunicationError&) {
      impl.renew(at, held);
      impl.current = (at + 1) % impl.members.size();
      std::this_thread::sleep_for(milliseconds(50));
      continue;
    } catch (const TimeoutError&) {
      continue;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(grpcDeadline(slice_end));
    if (!tok.empty()) ctx.AddMetadata(kTokenKey, tok);
    std::unique_lock<std::mutex> registry(impl.calls_mu);
    const auto waiting = impl.waits.emplace(cancel, &ctx);
    registry.unlock();
    struct Unregister {
      Impl& impl;
      decltype(impl.waits)::iterator it;
      ~Unregister() {
        std::lock_guard<std::mutex> lock(impl.calls_mu);
        impl.waits.erase(it);
      }
    } unregister{impl, waiting};
    if (cancel && cancel->load()) return false;  // set before it was registered
    auto stream = m.watch->Watch(&ctx);
    pb::WatchRequest req;
    auto* create = req.mutable_create_request();
    create->set_key(key);
    if (!range_end.empty()) create->set_range_end(range_end);
    create->set_start_revision(revision + 1);
    bool changed = false;
    std::string cancelled_why;
    if (stream->Write(req)) {
      pb::WatchResponse resp;
      while (stream->Read(&resp)) {
        if (resp.compact_revision() > 0 || resp.events_size() > 0) {
          changed = true;
          break;
        }
        if (resp.canceled()) {
          cancelled_why = resp.cancel_reason().empty() ? "watch cancelled" : resp.cancel_reason();
          break;
        }
      }
    }
    ctx.TryCancel();
    const grpc::Status s = stream->Finish();
    if (changed) return true;
    if (!cancelled_why.empty()) {
      if (!tok.empty() && contains(cancelled_why, "auth")) {
        impl.forgetToken(tok);
        continue;
      }
      impl.fail(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, cancelled_why), "watch", m);
    }
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
        s.error_code() == grpc::StatusCode::CANCELLED || s.ok()) {
      continue;  // the slice ended
    }
    if (!tok.empty() && needsToken(s)) {
      impl.forgetToken(tok);
      continue;
    }
    if (unreachable(s, *m.channel)) {
      impl.renew(at, held);
      impl.current = (at + 1) % impl.members.size();
      std::this_thread::sleep_for(milliseconds(50));
      continue;
    }
    impl.fail(s, "watch", m);
  }
  return false;
}

}  // namespace cxxlaunch::rendezvous
