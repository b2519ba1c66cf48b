#pragma once
// Test helper: runs a real binary with its stdout and stderr captured in files, so a test can
// signal it while it runs and read everything it printed afterwards.

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace cxxlaunch::testing {

struct Finished {
  int exit_code = -1;  // 128+signal when killed by a signal, as a shell reports it
  std::string out;
  std::string err;
};

class Subprocess {
 public:
  // Starts argv[0] (a path) with the current environment plus `env` (empty value: unset).
  explicit Subprocess(const std::vector<std::string>& argv,
                      const std::map<std::string, std::string>& env = {});
  ~Subprocess();  // kills the process group if still running
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  // Waits up to `timeout`; nullopt if still running.
  std::optional<Finished> wait(std::chrono::milliseconds timeout);
  // Output so far.
  std::string out() const;
  std::string err() const;

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  std::string dir_;
};

// Runs to completion; fails the test (throws) if it takes longer than `timeout`.
Finished run(const std::vector<std::string>& argv,
             const std::map<std::string, std::string>& env = {},
             std::chrono::milliseconds timeout = std::chrono::seconds(60));

// A fresh temporary directory, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string readFile(const std::string& path);

void sleepFor(std::chrono::milliseconds duration);

// Polls `predicate` every 10 ms until it holds or `timeout` passes; returns its last value.
template <typename Predicate>
bool eventually(Predicate predicate, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!predicate()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    sleepFor(std::chrono::milliseconds(10));
  }
  return true;
}
// A TCP port that was free on this machine a moment ago.
int freePort();

// True while a process with this pid exists and is not a zombie.
bool alive(pid_t pid);

}  // namespace cxxlaunch::testing
