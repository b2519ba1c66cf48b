#pragma once
// A test program's main for tests that need something this machine may lack (a GPU, a writable
// cgroup). Catch2 v2 (Debian 12's) has no SKIP, so without it the program exits with 77 before
// any test runs, and ctest (SKIP_RETURN_CODE 77) reports each test as skipped, never as passed.
// Listing the tests, which catch_discover_tests does at build time, works without it.
// Include from the one file that defines CATCH_CONFIG_RUNNER.

#include <catch2/catch.hpp>
#include <cstdio>
#include <functional>
#include <string>

namespace cxxlaunch::testing {

// Runs the tests, unless `missing()` (asked only when tests are to run) names what is missing.
inline int runUnlessMissing(int argc, char** argv, const std::function<std::string()>& missing) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  const Catch::ConfigData& config = session.configData();
  const bool only_lists = config.listTests || config.listTestNamesOnly || config.listTags ||
                          config.listReporters || config.showHelp || config.libIdentify;
  if (!only_lists) {
    if (const std::string why = missing(); !why.empty()) {
      std::fprintf(stderr, "%s: %s; skipped (exit code 77)\n", argv[0], why.c_str());
      return 77;
    }
  }
  return session.run();
}

}  // namespace cxxlaunch::testing
