#include "rendezvous/endpoint_probe.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <memory>

#include "common/error.h"
#include "common/host.h"

namespace cxxlaunch::rendezvous {
namespace {

using Clock = std::chrono::steady_clock;

// The client connection preface of HTTP/2 (RFC 9113, 3.4): the magic and an empty SETTINGS.
constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\4\0\0\0\0\0";
constexpr size_t kPrefaceBytes = sizeof(kPreface) - 1;
constexpr size_t kFrameHeaderBytes = 9;
constexpr size_t kKeptBytes = 64;

class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

// Waits for `events` on `fd` until `deadline`; false when it passed.
bool waitFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(left));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
}

bool connectBy(int fd, const addrinfo& address, Clock::time_point deadline) {
  if (::connect(fd, address.ai_addr, address.ai_addrlen) == 0) return true;
  if (errno != EINPROGRESS || !waitFor(fd, POLLOUT, deadline)) return false;
  int error = 0;
  socklen_t len = sizeof(error);
  return ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) == 0 && error == 0;
}

EndpointAnswer::Kind classify(const std::string& bytes) {
  if (bytes.empty()) return EndpointAnswer::Kind::kSilent;
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  // A TLS record: content type alert (21) or handshake (22), protocol version 3.x.
  if (bytes.size() >= 2 && (byte(0) == 21 || byte(0) == 22) && byte(1) == 3) {
    return EndpointAnswer::Kind::kTls;
  }
  // The server's preface is a SETTINGS frame (type 4) on stream 0.
  if (bytes.size() >= kFrameHeaderBytes && byte(3) == 4 &&
      (byte(5) | byte(6) | byte(7) | byte(8)) == 0) {
    return EndpointAnswer::Kind::kHttp2;
  }
  return EndpointAnswer::Kind::kOther;
}

}  // namespace

std::string printableBytes(const std::string& bytes) {
  std::string out;
  for (const char c : bytes) {
    if (c == '\r') {
      out += "\\r";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += c;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", static_cast<unsigned char>(c));
      out += hex;
    }
  }
  return out;
}

// 1. Connect, within the timeout; no connection: kNothing.
// 2. Send the HTTP/2 preface.
// 3. Read until a frame header's worth has come, the peer closes, or the timeout; then what
//    came is classified. A reply that is not HTTP/2 gets 100 ms more to say more, for the
//    message.
EndpointAnswer probeEndpoint(const std::string& endpoint, Millis timeout) {
  const auto where = parseHostPort(endpoint, 0);
  if (!where || where->port == 0) throw InvalidArgument("'" + endpoint + "' is not HOST:PORT");
  const auto deadline = Clock::now() + timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(where->host.c_str(), std::to_string(where->port).c_str(), &hints, &found) !=
          0 ||
      found == nullptr) {
    return {};
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, ::freeaddrinfo);
  Socket socket(::socket(found->ai_family, found->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (socket.fd() < 0 || !connectBy(socket.fd(), *found, deadline)) return {};
  // The peer may close before it reads: no SIGPIPE, and a failed send is fine.
  (void)::send(socket.fd(), kPreface, kPrefaceBytes, MSG_NOSIGNAL);
  EndpointAnswer answer;
  std::string& bytes = answer.first_bytes;
  auto read_until = [&](size_t want, Clock::time_point until) {
    while (bytes.size() < want && waitFor(socket.fd(), POLLIN, until)) {
      char buffer[kKeptBytes];
      const ssize_t n = ::recv(socket.fd(), buffer, want - bytes.size(), 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return;
      if (n > 0) bytes.append(buffer, static_cast<size_t>(n));
    }
  };
  read_until(kFrameHeaderBytes, deadline);
  answer.kind = classify(bytes);
  if (answer.kind == EndpointAnswer::Kind::kOther) {
    read_until(kKeptBytes, Clock::now() + Millis(100));
  }
  return answer;
}

}  // namespace cxxlaunch::rendezvous
