#pragma once
// Spawning one worker process the way the node agent needs it:
//  - its own process group (so a stop signal reaches everything it started),
//  - PR_SET_PDEATHSIG=SIGKILL (so a killed agent leaves no orphan), re-checked after setting it,
//  - stdin from /dev/null, stdout and stderr into pipes the agent reads,
//  - default signal dispositions and an empty signal mask (the agent blocks signals for signalfd).
// Everything the child needs is prepared before it exists, so spawning is safe with threads
// running; the child borrows the agent's memory until it execs (clone with CLONE_VFORK).

#include <sys/types.h>

#include <string>
#include <vector>

namespace cxxlaunch::launcher {

struct SpawnSpec {
  std::string program;            // path to execute
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // complete environment, "NAME=value"
};

struct SpawnedProcess {
  pid_t pid = -1;
  int stdout_fd = -1;  // read ends, non-blocking, close-on-exec
  int stderr_fd = -1;
};

// Throws SystemError when fork or exec fails (exec errors are reported back through a pipe).
SpawnedProcess spawnProcess(const SpawnSpec& spec);

// "SIGSEGV" for 11; "SIG42" for a signal without a name.
std::string signalName(int signal);

// `digits` random hexadecimal digits, for run and node ids.
std::string randomHex(int digits);

// The current environment as "NAME=value" strings.
std::vector<std::string> currentEnvironment();

}  // namespace cxxlaunch::launcher
