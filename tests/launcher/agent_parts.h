#pragma once
// Test helpers for the agent's parts (worker_group, monitor): real workers, started as the agent
// starts them, from shell commands.

#include <unistd.h>

#include <csignal>
#include <string>

#include "launcher/process.h"
#include "launcher/worker_group.h"

namespace cxxlaunch::testing {

// A worker running `sh -c script`, with its heartbeat file at `heartbeat` ("" for none).
inline std::array<int, 2> startShell(launcher::WorkerGroup& group, int local_rank,
                                     const std::string& script, const std::string& heartbeat = "") {
  launcher::Worker worker;
  worker.local_rank = worker.global_rank = local_rank;
  worker.heartbeat_file = heartbeat;
  launcher::SpawnSpec spec;
  spec.program = "/bin/sh";
  spec.argv = {"/bin/sh", "-c", script};
  spec.env = {"PATH=/usr/bin:/bin"};
  return group.spawn(std::move(worker), std::move(spec));
}

// Keeps the agent's signals blocked for a test (the agent blocks them before any thread starts,
// and reads them from a signalfd) and restores the mask after it.
class AgentSignalMask {
 public:
  AgentSignalMask() {
    sigset_t none;
    sigemptyset(&none);
    ::pthread_sigmask(SIG_BLOCK, &none, &saved_);
    sigset_t agent;
    sigemptyset(&agent);
    for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) {
      sigaddset(&agent, sig);
    }
    ::pthread_sigmask(SIG_BLOCK, &agent, nullptr);
  }
  ~AgentSignalMask() { ::pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }
  AgentSignalMask(const AgentSignalMask&) = delete;
  AgentSignalMask& operator=(const AgentSignalMask&) = delete;

 private:
  sigset_t saved_;
};

}  // namespace cxxlaunch::testing
