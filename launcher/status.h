#pragma once
// `cxxlaunch status`: what the rendezvous server knows of a run, as a table for people.

#include <string>

#include "launcher/cli.h"

namespace cxxlaunch::launcher {

// Asks the server; throws StaleError for an unknown run, CommunicationError when unreachable.
std::string describeRun(const StatusOptions& options);

}  // namespace cxxlaunch::launcher
