// The launcher's progress display and straggler check, end to end: the real `cxxlaunch` running
// a real trainer (progress_trainer.cc) under a pseudo-terminal and into pipes, and `cxxlaunch
// status` against a run where one rank is slow.

#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "support/pty.h"
#include "support/status_rows.h"
#include "support/subprocess.h"

using namespace cxxlaunch::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

// Every live line drawn ("\r" + the line + erase to the end of the line).
std::vector<std::string> liveLines(const std::string& text) {
  std::vector<std::string> lines;
  const std::regex drawn("\r(step [^\r\n\x1b]*)\x1b\\[K");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), drawn);
       it != std::sregex_iterator(); ++it) {
    lines.push_back((*it)[1]);
  }
  return lines;
}

// The steps column of a rank's row in `cxxlaunch status`; -1 when it shows none.
int64_t stepsOf(const std::string& row) {
  std::istringstream in(row);
  std::string rank, node, pid, state, steps;
  in >> rank >> node >> pid >> state >> steps;
  return !steps.empty() && std::isdigit(static_cast<unsigned char>(steps[0])) ? std::stoll(steps)
                                                                              : -1;
}

bool hasControlBytes(const std::string& text) {
  return text.find('\x1b') != std::string::npos || text.find('\r') != std::string::npos;
}

}  // namespace

TEST_CASE(
    "On a terminal the launcher shows a live progress line that the ranks' lines scroll above",
    "[progress][integration]") {
  TempDir logs;
  Pty pty({CXXLAUNCH_BIN, "run", "--nproc_per_node=2", "--log_dir", logs.path(), PROGRESS_TRAINER,
           "--steps", "40", "--step_ms", "40", "--print_every", "10"},
          {{"TERM", "xterm"}});
  const std::string text = pty.readToEnd(120s);
  REQUIRE(pty.wait() == 0);
  INFO(text);
  const auto lines = liveLines(text);
  // Redrawn as the steps go by, up to the total, with the rate, the ETA and the loss.
  std::set<std::string> counts;
  for (const auto& line : lines) counts.insert(line.substr(0, line.find(' ', 5)));
  CHECK(counts.size() >= 3);
  REQUIRE(!lines.empty());
  CHECK_THAT(lines.back(), Catch::StartsWith("step 40/40 [####################] 100%"));
  CHECK_THAT(lines.back(), Catch::Contains(" steps/s") && Catch::Contains("loss "));
  bool eta = false;
  for (const auto& line : lines) eta = eta || line.find(" ETA ") != std::string::npos;
  CHECK(eta);
  // Rank 0's lines scroll above it: each starts on a line of its own (after a newline, or after
  // the live line was erased), never glued to the live line.
  for (int step : {10, 20, 30, 40}) {
    const std::string line = "[rank 0]: trained " + std::to_string(step) + " steps";
    const size_t at = text.find(line);
    REQUIRE(at != std::string::npos);
    CHECK((text[at - 1] == '\n' || text.compare(at - 4, 4, "\r\x1b[K") == 0));
  }
  // The last live line stays on the screen, as a line of its own.
  CHECK(text.find(lines.back() + "\x1b[K\r\n") != std::string::npos);
}

TEST_CASE("A failed run's last progress stays on the terminal, above the failure table",
          "[progress][integration]") {
  TempDir logs;
  Pty pty({CXXLAUNCH_BIN, "run", "--nproc_per_node=2", "--log_dir", logs.path(), PROGRESS_TRAINER,
           "--steps", "40", "--step_ms", "30", "--exit_at", "15"},
          {{"TERM", "xterm"}});
  const std::string text = pty.readToEnd(120s);
  CHECK(pty.wait() == 3);
  INFO(text);
  const auto lines = liveLines(text);
  REQUIRE(!lines.empty());
  CHECK_THAT(lines.back(), Catch::StartsWith("step 1"));  // 14 or 15 of 40
  const size_t kept = text.find(lines.back() + "\x1b[K\r\n");
  const size_t table = text.find("root cause");
  REQUIRE(kept != std::string::npos);
  REQUIRE(table != std::string::npos);
  CHECK(kept < table);
  CHECK(text.find("\x1b", table) == std::string::npos);  // no live line after it
}

TEST_CASE(
    "Into a pipe the launcher prints plain lines: no progress by default, plain progress "
    "lines with --progress on",
    "[progress][integration]") {
  TempDir logs;
  auto plain = run({CXXLAUNCH_BIN, "run", "--nproc_per_node=2", "--log_dir", logs.path(),
                    PROGRESS_TRAINER, "--steps", "20", "--step_ms", "10", "--print_every", "10"},
                   {{"TERM", "xterm"}}, 120s);
  INFO(plain.out << plain.err);
  REQUIRE(plain.exit_code == 0);
  CHECK_THAT(plain.out, Catch::Contains("[rank 0]: trained 20 steps"));
  CHECK_FALSE(hasControlBytes(plain.out + plain.err));
  CHECK_THAT(plain.out, !Catch::Contains("cxxlaunch: step"));

  auto on = run({CXXLAUNCH_BIN, "run", "--nproc_per_node=2", "--log_dir", logs.path(), "--progress",
                 "on", PROGRESS_TRAINER, "--steps", "20", "--step_ms", "10", "--set_total"},
                {{"TERM", "xterm"}}, 120s);
  INFO(on.out << on.err);
  REQUIRE(on.exit_code == 0);
  CHECK_FALSE(hasControlBytes(on.out + on.err));
  CHECK_THAT(on.out, Catch::Contains("cxxlaunch: step 20/20 (100%)"));

  // The config key and its variable say the same; off shows nothing even on a terminal.
  auto by_variable = run({CXXLAUNCH_BIN, "run", "--nproc_per_node=1", "--log_dir", logs.path(),
                          PROGRESS_TRAINER, "--steps", "5", "--step_ms", "1"},
                         {{"CXXLAUNCH_PROGRESS", "on"}}, 120s);
  CHECK_THAT(by_variable.out, Catch::Contains("cxxlaunch: step 5/5 (100%)"));
  Pty pty({CXXLAUNCH_BIN, "run", "--nproc_per_node=1", "--log_dir", logs.path(), "--progress",
           "off", PROGRESS_TRAINER, "--steps", "10", "--step_ms", "20"},
          {{"TERM", "xterm"}});
  const std::string text = pty.readToEnd(120s);
  CHECK(pty.wait() == 0);
  CHECK(text.find('\x1b') == std::string::npos);

  auto bad = run({CXXLAUNCH_BIN, "run", "--progress", "sometimes", PROGRESS_TRAINER});
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("sometimes") && Catch::Contains("auto"));
}

TEST_CASE(
    "cxxlaunch status flags the slow rank SLOW, and the run summary records the step "
    "times",
    "[progress][status][integration]") {
  // Three ranks; rank 1 works 60 ms more per step than the others, who wait for it in the
  // gradients' all-reduce.
  TempDir logs;
  const std::string endpoint = "127.0.0.1:" + std::to_string(freePort());
  Subprocess launcher({CXXLAUNCH_BIN,
                       "run",
                       "--nproc_per_node=3",
                       "--log_dir",
                       logs.path(),
                       "--rdzv_endpoint",
                       endpoint,
                       "--rdzv_id",
                       "straggler",
                       "--rdzv_conf",
                       "keep_alive_interval=0.2",
                       PROGRESS_TRAINER,
                       "--steps",
                       "80",
                       "--step_ms",
                       "30",
                       "--slow_rank",
                       "1",
                       "--slow_ms",
                       "60"});
  std::string text;
  const bool flagged = eventually(
      [&] {
        text = run({CXXLAUNCH_BIN, "status", "--rdzv_endpoint", endpoint, "--rdzv_id", "straggler"})
                   .out;
        // Past the first steps: every rank has a full window of step times.
        for (int rank = 0; rank < 3; ++rank) {
          if (stepsOf(workerRow(text, rank)) < 25) return false;
        }
        return workerRow(text, 1).find("SLOW") != std::string::npos;
      },
      60s);
  INFO(text);
  CHECK(flagged);
  CHECK_THAT(workerRow(text, 0), !Catch::Contains("SLOW") && Catch::Contains(" ms"));
  CHECK_THAT(workerRow(text, 2), !Catch::Contains("SLOW") && Catch::Contains(" ms"));
  CHECK_THAT(text, Catch::Contains("rank 1 is SLOW"));

  auto r = launcher.wait(120s);
  REQUIRE(r);
  CHECK(r->exit_code == 0);
  std::string summary_path;
  for (const auto& entry : fs::recursive_directory_iterator(logs.path())) {
    if (entry.path().filename() == "run-summary.json") summary_path = entry.path();
  }
  REQUIRE(!summary_path.empty());
  const auto summary = nlohmann::json::parse(readFile(summary_path));
  INFO(summary.dump(2));
  REQUIRE(summary["step_times"].size() == 3);
  for (const auto& t : summary["step_times"]) {
    CHECK(t["steps"] == 80);
    CHECK(t["step_ms"].get<double>() >= 90);  // everyone's step waits for rank 1's
    CHECK(t["slow"] == (t["rank"] == 1));
    if (t["rank"] == 1) CHECK(t["work_ms"].get<double>() >= 90);
  }
}
