#pragma once
// The launcher's last resort after a stop signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT): whatever its
// threads are stuck in (a gRPC server that cannot shut down, a call whose deadline never fires
// because gRPC could not start its threads), the process is gone at most the shutdown grace plus
// kStopMargin after the first one, with exit code 128 + that signal and one line on stderr. Its
// workers then die of PR_SET_PDEATHSIG and of the agent's watchdog process.
//
// The agent blocks these signals and reads them from a signalfd, so a stuck agent never sees
// them: a timer (SIGALRM every 100 ms, no thread: none may be left to start) looks at the pending
// ones, and the agent reports those it read itself (noteStopSignal). Both are safe from any
// thread and from a signal handler.

#include <chrono>

namespace cxxlaunch::launcher {

// What the launcher's own exit may take after the workers' grace: the summary, the console.
inline constexpr std::chrono::seconds kStopMargin{1};

// Starts the timer; from now on the first stop signal starts the countdown of `grace` +
// kStopMargin. Call once, after blockAgentSignals. Throws SystemError.
void armStopDeadline(std::chrono::milliseconds grace);

// A stop signal the caller has read: starts the countdown unless one runs.
void noteStopSignal(int signal);

}  // namespace cxxlaunch::launcher
