#pragma once
// Test helper: another program holding a loopback port (not a rendezvous server), for the tests
// of what a client makes of an endpoint that answers with something else, or not at all.

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <string>
#include <thread>
#include <vector>

namespace cxxlaunch::testing {

// Another program on a loopback port (bound to port 0): it accepts every connection and sends
// `answer` (nothing when empty), then reads until the client goes; `endpoint` names it.
class ForeignListener final {
 public:
  explicit ForeignListener(std::string answer) : answer_(std::move(answer)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(::listen(fd_, 16) == 0);
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    endpoint = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
    thread_ = std::thread([this] { serve(); });
  }
  ~ForeignListener() {
    stop_ = true;
    thread_.join();
    for (int fd : clients_) ::close(fd);
    ::close(fd_);
  }
  std::string endpoint;

 private:
  void serve() {
    while (!stop_) {
      std::vector<pollfd> fds = {{fd_, POLLIN, 0}};
      for (int fd : clients_) fds.push_back({fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        const int client = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (client < 0) continue;
        if (!answer_.empty()) (void)::send(client, answer_.data(), answer_.size(), MSG_NOSIGNAL);
        clients_.push_back(client);
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        char buffer[4096];
        if ((fds[i].revents & (POLLIN | POLLHUP)) &&
            ::read(fds[i].fd, buffer, sizeof(buffer)) <= 0) {
          ::close(fds[i].fd);
          std::erase(clients_, fds[i].fd);
        }
      }
    }
  }

  const std::string answer_;
  int fd_ = -1;
  std::vector<int> clients_;
  std::atomic<bool> stop_ = false;
  std::thread thread_;
};

}  // namespace cxxlaunch::testing
