#pragma once
// `cxxlaunch test`: runs the packaged self-test worker (`cxxlaunch_selftest`, installed next to
// the `cxxlaunch` binary; $CXXLAUNCH_SELFTEST overrides the path) through the normal agent with
// the user's flags and config, then says plainly whether the setup is ready. Two workers per node
// when neither a flag nor the config says how many.

#include <ostream>
#include <string>
#include <vector>

namespace cxxlaunch::launcher {

// `args`: launch flags (as `cxxlaunch run` takes them), then optionally `--` and arguments for
// the worker. Returns the exit code: 0 ready, 1 not ready. Bad flags throw UsageError.
int runSelfTest(const std::vector<std::string>& args, std::ostream& out);

}  // namespace cxxlaunch::launcher
