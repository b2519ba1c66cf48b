#pragma once
// `cxxlaunch status`: what the rendezvous server knows of a run, as a table for people: its
// round and nodes, and each worker's state and last progress as its node last reported them.

#include <chrono>
#include <string>

#include "launcher/cli.h"
#include "rendezvous/run_state.h"

namespace cxxlaunch::launcher {

// Asks the server; throws StaleError for an unknown run, CommunicationError when unreachable.
std::string describeRun(const StatusOptions& options);

// The text describeRun prints for `status`. A running worker whose last progress is at least
// `silent_after` old is flagged "silent".
std::string formatRunStatus(const std::string& run_id, const std::string& endpoint,
                            const rendezvous::RunStatus& status,
                            std::chrono::milliseconds silent_after);

}  // namespace cxxlaunch::launcher
