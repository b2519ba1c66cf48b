#pragma once
// Test helper: a real cxxlaunchd on a free loopback port, for the integration tests of targets
// that define CXXLAUNCHD_BIN.

#include <catch2/catch.hpp>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "support/subprocess.h"

namespace cxxlaunch::testing {

// A real cxxlaunchd on a free loopback port.
struct Daemon {
  explicit Daemon(const std::vector<std::string>& extra = {},
                  const std::map<std::string, std::string>& env = {}) {
    std::vector<std::string> argv = {CXXLAUNCHD_BIN, "--port", "0"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    process = std::make_unique<Subprocess>(argv, env);
    REQUIRE(eventually([&] { return process->out().find("listening on") != std::string::npos; },
                       std::chrono::seconds(10)));
    std::smatch m;
    const std::string out = process->out();
    REQUIRE(std::regex_search(out, m, std::regex("listening on (\\S+)")));
    endpoint = m[1];
  }
  std::unique_ptr<Subprocess> process;
  std::string endpoint;
};

}  // namespace cxxlaunch::testing
