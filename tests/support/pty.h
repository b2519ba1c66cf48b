#pragma once
// Test helper: a real binary on the slave side of a new pseudo-terminal (forkpty), 120 columns
// wide; the test reads what it shows and types on the master side.

#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace cxxlaunch::testing {

// A process on the slave side of a new pseudo-terminal; the test types on the master side.
class Pty {
 public:
  Pty(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
    struct winsize size {};
    size.ws_row = 40;
    size.ws_col = 120;
    pid_ = ::forkpty(&master_, nullptr, nullptr, &size);
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
  }
  ~Pty() {
    if (!reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(master_);
  }
  Pty(const Pty&) = delete;
  Pty& operator=(const Pty&) = delete;

  int master() const { return master_; }

  void send(const std::string& keys) {
    REQUIRE(::write(master_, keys.data(), keys.size()) == static_cast<ssize_t>(keys.size()));
  }

  // Reads until `text` appears after what earlier expects consumed; false on timeout or EOF.
  bool expect(const std::string& text,
              std::chrono::milliseconds timeout = std::chrono::seconds(15)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      if (auto at = output_.find(text, consumed_); at != std::string::npos) {
        consumed_ = at + text.size();
        return true;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{master_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buffer[4096];
      const ssize_t n = ::read(master_, buffer, sizeof(buffer));
      if (n <= 0) return false;  // EIO: the child closed the terminal
      output_.append(buffer, static_cast<size_t>(n));
    }
  }

  // Exit code, or 128+signal.
  int wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // Reads until the child closes the terminal (every process on it has gone), or `timeout`;
  // returns everything read.
  const std::string& readToEnd(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{master_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buffer[4096];
      const ssize_t n = ::read(master_, buffer, sizeof(buffer));
      if (n <= 0) break;  // EIO: the child closed the terminal
      output_.append(buffer, static_cast<size_t>(n));
    }
    return output_;
  }

  const std::string& output() const { return output_; }

 private:
  pid_t pid_ = -1;
  int master_ = -1;
  bool reaped_ = false;
  std::string output_;
  size_t consumed_ = 0;
};

}  // namespace cxxlaunch::testing
