#include "launcher/failure.h"

#include <catch2/catch.hpp>
#include <csignal>
#include <fstream>

#include "support/subprocess.h"

using namespace cxxlaunch::launcher;
using cxxlaunch::testing::readFile;
using cxxlaunch::testing::TempDir;
using Clock = std::chrono::system_clock;

TEST_CASE("The root cause is the earliest failure, ties to the lowest rank", "[failure]") {
  const auto t0 = Clock::from_time_t(1000);
  std::vector<Failure> failures(3);
  failures[0].global_rank = 2;
  failures[0].time = t0 + std::chrono::seconds(1);
  failures[1].global_rank = 5;
  failures[1].time = t0;
  failures[2].global_rank = 3;
  failures[2].time = t0;
  REQUIRE(rootCause(failures).global_rank == 3);
}

TEST_CASE("A failure's exit code is the worker's, or 128 + signal", "[failure]") {
  Failure exited;
  exited.exit_code = 7;
  REQUIRE(exited.processExitCode() == 7);
  REQUIRE(exited.statusText() == "exit 7");
  Failure killed;
  killed.signal = SIGSEGV;
  REQUIRE(killed.processExitCode() == 139);
  REQUIRE(killed.statusText() == "SIGSEGV (11)");
}

TEST_CASE("Error files in torchelastic's formats are read", "[failure]") {
  TempDir dir;
  const std::string path = dir.path() + "/error.json";
  REQUIRE_FALSE(readErrorFile(path).has_value());
  std::ofstream(path) << R"({"message": {"message": "RuntimeError: boom", "extraInfo": )"
                      << R"({"py_callstack": "...", "timestamp": "1700000000"}}})";
  auto report = readErrorFile(path);
  REQUIRE(report);
  REQUIRE(report->message == "RuntimeError: boom");
  REQUIRE(report->time == Clock::from_time_t(1700000000));
  std::ofstream(path) << R"({"message": "plain"})";
  REQUIRE(readErrorFile(path)->message == "plain");
  std::ofstream(path) << "not json";
  REQUIRE_FALSE(readErrorFile(path).has_value());
}

TEST_CASE("The failure table and run-summary.json name the root cause", "[failure]") {
  TempDir dir;
  RunReport report;
  report.run_id = "job";
  report.program = "/bin/train";
  report.status = "failed";
  report.exit_code = 139;
  report.log_dir = dir.path();
  report.confinement = "process groups";
  report.failures.resize(2);
  report.failures[0].global_rank = 0;
  report.failures[0].exit_code = 1;
  report.failures[0].time = Clock::from_time_t(2000);
  report.failures[1].global_rank = 1;
  report.failures[1].signal = SIGSEGV;
  report.failures[1].time = Clock::from_time_t(1000);
  report.failures[1].error_message = "segfault in layer 3\nmore";
  report.failures[1].stderr_tail = {"last words"};
  const std::string table = formatFailureTable(report);
  REQUIRE_THAT(table, Catch::Contains("/bin/train FAILED"));
  REQUIRE_THAT(table, Catch::Contains("root cause (*): rank 1 SIGSEGV (11)"));
  REQUIRE_THAT(table, Catch::Contains("error: segfault in layer 3\n"));
  REQUIRE_THAT(table, Catch::Contains("| last words"));
  REQUIRE_THAT(table, Catch::Contains("* 1 "));

  writeRunSummary(dir.path() + "/run-summary.json", report);
  const std::string json = readFile(dir.path() + "/run-summary.json");
  REQUIRE_THAT(json, Catch::Contains(R"("root_cause_rank": 1)"));
  REQUIRE_THAT(json, Catch::Contains(R"("signal": "SIGSEGV")"));
  REQUIRE_THAT(json, Catch::Contains(R"("exit_code": 139)"));
  REQUIRE_THAT(json, Catch::Contains(R"("confinement": "process groups")"));
}

TEST_CASE("run-summary.json escapes bytes that are not UTF-8, as Python's backslashreplace",
          "[failure]") {
  TempDir dir;
  RunReport report;
  report.run_id = "job";
  report.program = "/bin/tr\xc3";
  report.args = {"x\xff", "caf\xc3\xa9"};
  report.status = "failed";
  report.exit_code = 3;
  report.log_dir = dir.path() + "/\xfe";
  report.failures.resize(1);
  report.failures[0].exit_code = 3;
  report.failures[0].host = "h\x80";
  report.failures[0].error_message = "bad \xe2\x82";
  report.failures[0].stderr_tail = {"cut mid-character \xe2\x82", "fine"};
  writeRunSummary(dir.path() + "/run-summary.json", report);
  const std::string json = readFile(dir.path() + "/run-summary.json");
  REQUIRE_THAT(json, Catch::Contains(R"("program": "/bin/tr\\xc3")"));
  REQUIRE_THAT(json, Catch::Contains(R"("x\\xff")"));
  REQUIRE_THAT(json, Catch::Contains("\"caf\xc3\xa9\""));  // valid text is kept as it is
  REQUIRE_THAT(json, Catch::Contains(R"(/\\xfe")"));
  REQUIRE_THAT(json, Catch::Contains(R"("host": "h\\x80")"));
  REQUIRE_THAT(json, Catch::Contains(R"("error": "bad \\xe2\\x82")"));
  REQUIRE_THAT(json, Catch::Contains(R"("cut mid-character \\xe2\\x82")"));
}
