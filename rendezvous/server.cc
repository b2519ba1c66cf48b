#include "rendezvous/server.h"

#include <absl/synchronization/mutex.h>
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>
#include <grpcpp/support/server_interceptor.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "common/host.h"
#include "rendezvous/server/core.h"
#include "rendezvous/server/rendezvous_service.h"
#include "rendezvous/server/store_service.h"
#include "rendezvous/wire.h"

namespace cxxlaunch::rendezvous {
namespace {

// gRPC answers a request it cannot decode with UNIMPLEMENTED and no message; the proto promises
// INVALID_ARGUMENT, and a client deserves to hear what was wrong. The interceptor sees the
// failed decoding (no message after POST_RECV_MESSAGE) and rewrites the status it sends.
class UndecodableRequest final : public grpc::experimental::Interceptor {
 public:
  explicit UndecodableRequest(grpc::experimental::ServerRpcInfo* info) : method_(info->method()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using Hook = grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(Hook::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      undecodable_ = true;
    }
    if (undecodable_ && methods->QueryInterceptionHookPoint(Hook::PRE_SEND_STATUS)) {
      methods->ModifySendStatus(
          {grpc::StatusCode::INVALID_ARGUMENT, server::undecodableMessage(method_)});
    }
    methods->Proceed();
  }

 private:
  const char* method_;
  bool undecodable_ = false;
};

class UndecodableRequestFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new UndecodableRequest(info);
  }
};

// A listening socket on a free port of `host` (IPv4), non-blocking, with SO_REUSEPORT so that
// gRPC can listen on the port too before this one closes; -1 when `host` is not an IPv4 address.
int listenOnFreePort(const std::string& host, int& port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) return -1;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd == -1) throw SystemError("listening on " + formatHostPort(host, 0), errno);
  const int on = 1;
  socklen_t len = sizeof(addr);
  if (::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, sizeof(on)) != 0 ||
      ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      ::listen(fd, SOMAXCONN) != 0) {
    const int err = errno;
    ::close(fd);
    throw SystemError("listening on " + formatHostPort(host, 0), err);
  }
  port = ntohs(addr.sin_port);
  return fd;
}

}  // namespace

struct RendezvousServer::Impl {
  explicit Impl(const ServerOptions& options)
      : options(options), core(options), store(core), rendezvous(core) {}
  ServerOptions options;
  server::Core core;
  server::StoreService store;
  server::RendezvousService rendezvous;
  // Made by start() (a launcher whose workers never use the store starts no thread for it);
  // after the server in shutdown, destroyed after it.
  std::optional<server::Joins> joins;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  // start_on_first_connection: the plain listening socket, the thread that waits on it and
  // starts gRPC, and how that went.
  int door = -1;
  int door_bell = -1;  // an eventfd: shutdown() rings it
  std::thread doorman;
  std::mutex start_mu;
  std::condition_variable start_cv;
  bool starting = false;
  std::exception_ptr start_error;

  // Builds and starts gRPC; throws as the constructor documents. With `door` open, gRPC shares
  // its port (SO_REUSEPORT).
  void start(std::optional<grpc::SslServerCredentialsOptions> ssl);
  void serveDoor();
};

RendezvousServer::RendezvousServer(const ServerOptions& options)
    : impl_(std::make_unique<Impl>(options)) {
  wire::quietGrpcLogs();
  // Debian builds abseil without NDEBUG, so every lock of gRPC's mutexes also ran its deadlock
  // detector, whose graph lookups grow with the mutexes alive: one set per open call, 5.5% of
  // the daemon's time at 65,536 waiting joins (perf). A diagnostic, off as in release builds.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // The files are read here even when gRPC starts in the background: a wrong path is the
  // caller's mistake, to be told at once.
  std::optional<grpc::SslServerCredentialsOptions> ssl;
  if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
    ssl.emplace();
    ssl->pem_key_cert_pairs.push_back({wire::readTlsFile(options.tls_key_file, "key"),
                                       wire::readTlsFile(options.tls_cert_file, "certificate")});
    if (!options.tls_ca_file.empty()) {
      ssl->pem_root_certs = wire::readTlsFile(options.tls_ca_file, "CA");
      ssl->client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
  }
  if (options.start_on_first_connection && options.port == 0 && !ssl) {
    impl_->door = listenOnFreePort(options.host, impl_->port);
  }
  if (impl_->door == -1) {
    impl_->start(std::move(ssl));
    return;
  }
  try {
    impl_->door_bell = CXXLAUNCH_SYSCALL(::eventfd(0, EFD_CLOEXEC));
    impl_->doorman = std::thread([impl = impl_.get()] { impl->serveDoor(); });
  } catch (...) {
    ::close(impl_->door);
    if (impl_->door_bell != -1) ::close(impl_->door_bell);
    impl_->core.stop();
    throw;
  }
}

// Waits for the first connection (or shutdown), starts gRPC, and hands it the connections that
// came to the door meanwhile; then closes the door. One that comes between the last accept and
// the close is reset, and its client connects again (to gRPC: the store waits for its first
// answer).
void RendezvousServer::Impl::serveDoor() {
  pollfd fds[2] = {{door, POLLIN, 0}, {door_bell, POLLIN, 0}};
  while (::poll(fds, 2, -1) == -1 && errno == EINTR) {
  }
  if ((fds[1].revents & POLLIN) == 0) {
    {
      std::lock_guard<std::mutex> lock(start_mu);
      starting = true;
    }
    std::exception_ptr error;
    try {
      start(std::nullopt);
    } catch (...) {
      error = std::current_exception();
    }
    int fd;
    while ((fd = ::accept4(door, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)) != -1) {
      if (!server) {
        ::close(fd);
        continue;
      }
      const int on = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));  // as gRPC's own accepts
      grpc::AddInsecureChannelFromFd(server.get(), fd);
    }
    std::lock_guard<std::mutex> lock(start_mu);
    start_error = error;
    starting = false;
    start_cv.notify_all();
  }
  ::close(door);
  door = -1;
}

void RendezvousServer::Impl::start(std::optional<grpc::SslServerCredentialsOptions> ssl) {
  core.startTicker();  // threads first (Joins says why)
  joins.emplace(core, rendezvous);
  const std::shared_ptr<grpc::ServerCredentials> credentials =
      ssl ? grpc::SslServerCredentials(*ssl) : grpc::InsecureServerCredentials();
  grpc::ServerBuilder builder;
  int listening = 0;
  builder.AddListeningPort(formatHostPort(options.host, door == -1 ? options.port : port),
                           credentials, &listening);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // A taken port must fail, not share; the door's port is shared with the door.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, door == -1 ? 0 : 1);
  // No timer per call for the client's deadline: the client ends its own call when it passes
  // (and a dead client's connection ends all of its calls), and a parked call is answered by
  // Core within its own wait, never past max_wait. Debian's gRPC (no NDEBUG) files every timer
  // in a debug table of 1,009 lists that each add and cancel walks: at 65,536 waiting joins,
  // 9% of the daemon's time (perf).
  builder.AddChannelArgument(GRPC_ARG_ENABLE_DEADLINE_CHECKS, 0);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<UndecodableRequestFactory>());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.RegisterService(&store);
  builder.RegisterService(&rendezvous);
  joins->addTo(builder);
  server = builder.BuildAndStart();
  if (!server || listening == 0) {
    if (door == -1) core.stop();  // one started at the door still serves its own node
    // gRPC says only that it failed (and has closed what it opened by now): a process whose
    // descriptors are nearly all in use (a server needs a dozen or so) is told apart from a port.
    rlimit limit{};
    std::error_code ec;
    const auto open = std::distance(std::filesystem::directory_iterator("/proc/self/fd", ec),
                                    std::filesystem::directory_iterator());
    if (!ec && ::getrlimit(RLIMIT_NOFILE, &limit) == 0 &&
        open + 32 > static_cast<long>(limit.rlim_cur)) {
      throw SystemError("listening on " + formatHostPort(options.host, options.port), EMFILE);
    }
    throw CommunicationError("cannot listen on " + formatHostPort(options.host, options.port) +
                             ": the port is taken or the address is not on this machine");
  }
  if (door == -1) port = listening;
  joins->accept();
}

RendezvousServer::~RendezvousServer() { shutdown(); }

void RendezvousServer::checkStarted() {
  std::unique_lock<std::mutex> lock(impl_->start_mu);
  impl_->start_cv.wait(lock, [&] { return !impl_->starting; });
  if (impl_->start_error) std::rethrow_exception(impl_->start_error);
}

int RendezvousServer::port() const { return impl_->port; }

std::string RendezvousServer::endpoint() const {
  return formatHostPort(impl_->options.host, impl_->port);
}

std::shared_ptr<grpc::Channel> RendezvousServer::inProcessChannel() {
  if (!impl_->server) throw CommunicationError("the rendezvous server has not started gRPC");
  return impl_->server->InProcessChannel(grpc::ChannelArguments());
}

size_t RendezvousServer::runCount() const { return impl_->core.runCount(); }

int64_t RendezvousServer::heldBytes() const { return impl_->core.heldBytes(); }

bool RendezvousServer::waitUntilSettled(const std::string& run_id,
                                        std::chrono::milliseconds timeout) {
  return impl_->core.waitUntilSettled(run_id, timeout);
}

JoinPoll RendezvousServer::join(const std::string& run_id, const NodeSpec& node,
                                const RunSettings& settings, Millis poll,
                                const std::atomic<bool>& cancelled) {
  return impl_->core.joinHere(run_id, node, settings, poll, cancelled);
}

Verdict RendezvousServer::keepAlive(const std::string& run_id, const std::string& node_id,
                                    int64_t round, const std::vector<WorkerProgress>& workers) {
  return impl_->core.callHere(run_id, [&](RunState& state, SteadyTime now) {
    impl_->core.report(state, node_id, workers);
    return state.keepAlive(node_id, round, now);
  });
}

Verdict RendezvousServer::requestRestart(const std::string& run_id, const std::string& node_id,
                                         int64_t round, const FailureReport& failure) {
  return impl_->core.callHere(run_id, [&](RunState& state, SteadyTime now) {
    return state.requestRestart(node_id, round, impl_->core.failureToKeep(failure), now);
  });
}

Verdict RendezvousServer::leave(const std::string& run_id, const std::string& node_id,
                                int64_t round) {
  return impl_->core.callHere(
      run_id, [&](RunState& state, SteadyTime now) { return state.leave(node_id, round, now); });
}

void RendezvousServer::wakeJoins() { impl_->core.wakeHere(); }

// Ends the door's wait (or lets a start in progress finish) first.
void RendezvousServer::shutdown() {
  if (impl_->doorman.joinable()) {
    const uint64_t one = 1;
    (void)!::write(impl_->door_bell, &one, sizeof(one));
    impl_->doorman.join();
    ::close(impl_->door_bell);
  }
  if (!impl_->server) return;
  impl_->core.stop();  // answers parked calls first, so Shutdown does not wait for them
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  impl_->joins->close();  // the queue closes after the server, as gRPC requires
}

void RendezvousServer::wait() {
  if (impl_->server) impl_->server->Wait();
}

}  // namespace cxxlaunch::rendezvous
