// launcher/progress.h and the console's live line: what the launcher shows of the run's progress,
// and the straggler rule.

#include "launcher/progress.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "launcher/output.h"
#include "launcher/status.h"
#include "support/status_rows.h"
#include "support/subprocess.h"

using namespace cxxlaunch;
using namespace cxxlaunch::launcher;
using namespace std::chrono_literals;

namespace {

HeartbeatRecord record(int64_t steps, int64_t total, std::optional<double> loss = std::nullopt) {
  HeartbeatRecord r;
  r.steps = steps;
  r.total = total;
  r.loss = loss;
  return r;
}

}  // namespace

TEST_CASE("The progress line shows the slowest rank's steps, the rate, the ETA and rank 0's loss",
          "[progress]") {
  ProgressMeter meter;
  const auto t0 = ProgressMeter::Clock::time_point() + 1h;
  CHECK_FALSE(meter.started());
  meter.update({{0, record(10, 100, 2.5)}, {1, record(9, 100, 7.0)}}, t0);
  CHECK(meter.started());
  CHECK(meter.line(200) == "step 9/100 [#                   ] 9%  loss 2.5");  // no rate yet
  meter.update({{1, record(29, 100, 6.0)}, {0, record(30, 100, 1.5)}}, t0 + 10s);
  CHECK(meter.stepsPerSecond() == Approx(2.0));
  // 71 steps left at 2 steps/s: 35.5 s.
  CHECK(meter.line(200) == "step 29/100 [#####               ] 29%  2 steps/s  ETA 0:36  loss 1.5");
  CHECK(meter.line(12) == "step 29/100 ");  // cut to the terminal's width

  // No total: a count, a rate and no ETA.
  ProgressMeter open_ended;
  open_ended.update({{0, record(5, 0)}}, t0);
  open_ended.update({{0, record(25, 0)}}, t0 + 4s);
  CHECK(open_ended.line(200) == "step 25  5 steps/s");

  // Done: the rate no longer changes while the workers finish.
  ProgressMeter done;
  done.update({{0, record(0, 10)}}, t0);
  done.update({{0, record(10, 10)}}, t0 + 5s);
  done.update({{0, record(10, 10)}}, t0 + 9s);
  CHECK(done.stepsPerSecond() == Approx(2.0));

  // A restart from an earlier checkpoint measures the rate afresh.
  meter.update({{0, record(20, 100)}, {1, record(20, 100)}}, t0 + 11s);
  CHECK_FALSE(meter.stepsPerSecond());
}

TEST_CASE("Plain progress lines come every tenth of the total, and every 30 s without one",
          "[progress]") {
  ProgressMeter meter;
  const auto t0 = ProgressMeter::Clock::time_point() + 1h;
  std::vector<std::string> lines;
  for (int64_t step = 0; step <= 50; ++step) {
    meter.update({{0, record(step, 50)}}, t0 + std::chrono::seconds(step));
    if (auto line = meter.plainLine(t0 + std::chrono::seconds(step)); !line.empty()) {
      lines.push_back(line);
    }
  }
  REQUIRE(lines.size() == 11);
  CHECK(lines.front() == "cxxlaunch: step 0/50 (0%)\n");
  CHECK(lines[1] == "cxxlaunch: step 5/50 (10%)  1 steps/s  ETA 0:45\n");
  CHECK(lines.back() == "cxxlaunch: step 50/50 (100%)  1 steps/s\n");

  ProgressMeter open_ended;
  open_ended.update({{0, record(1, 0)}}, t0);
  CHECK(open_ended.plainLine(t0) == "cxxlaunch: step 1\n");
  open_ended.update({{0, record(2, 0)}}, t0 + 29s);
  CHECK(open_ended.plainLine(t0 + 29s).empty());
  open_ended.update({{0, record(3, 0)}}, t0 + 30s);
  CHECK_THAT(open_ended.plainLine(t0 + 30s), Catch::StartsWith("cxxlaunch: step 3  "));
}

TEST_CASE("Durations read as M:SS or H:MM:SS", "[progress]") {
  CHECK(formatDuration(0) == "0:00");
  CHECK(formatDuration(35.5) == "0:36");
  CHECK(formatDuration(725) == "12:05");
  CHECK(formatDuration(3 * 3600 + 2 * 60 + 11) == "3:02:11");
}

TEST_CASE("A rank whose work per step is above 1.25x the median is a straggler", "[progress]") {
  CHECK(stragglers({100, 101, 99, 126}) == std::vector<bool>{false, false, false, true});
  CHECK(stragglers({100, 125, 100}) == std::vector<bool>{false, false, false});  // not above
  CHECK(stragglers({100, 0, 300}) == std::vector<bool>{false, false, true});     // 0: no report
  CHECK(stragglers({100, 0}) == std::vector<bool>{false, false});  // one report: no median
  CHECK(stragglers({}).empty());
}

TEST_CASE("Status shows each worker's steps and step times and flags the slow one SLOW",
          "[progress][status]") {
  rendezvous::RunStatus s;
  s.round = 1;
  s.state = "running";
  rendezvous::NodeState n;
  n.spec.id = "10.0.0.1_77_abc";
  n.spec.addr = "10.0.0.1";
  n.spec.local_world_size = 3;
  n.node_rank = 0;
  for (int rank = 0; rank < 3; ++rank) {
    rendezvous::WorkerProgress w;
    w.local_rank = w.rank = rank;
    w.pid = 500 + rank;
    w.state = "running";
    w.progress_age = 100ms;
    w.steps = 40;
    w.step_us = 80'000;
    w.work_us = rank == 1 ? 75'000 : 30'000;
    n.workers.push_back(w);
  }
  s.participants.push_back(n);
  const std::string text = formatRunStatus("job", "h:1", s, 60s);
  INFO(text);
  CHECK_THAT(testing::workerRow(text, 0), Catch::Contains(" 40 ") && Catch::Contains("80.0 ms") &&
                                              Catch::Contains("30.0 ms") &&
                                              !Catch::Contains("SLOW"));
  CHECK_THAT(testing::workerRow(text, 1), Catch::Contains("75.0 ms SLOW"));
  CHECK_THAT(testing::workerRow(text, 2), !Catch::Contains("SLOW"));
  CHECK_THAT(text, Catch::Contains("rank 1 is SLOW: more than 1.25x the median work per step"));
}

namespace {

// The bytes a console wrote to a pipe so far.
std::string readAll(int fd) {
  std::string out;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof(buffer))) > 0;) out.append(buffer, n);
  return out;
}

}  // namespace

TEST_CASE("Lines scroll above the live line: erased, written, redrawn once", "[progress][output]") {
  int fds[2];
  REQUIRE(::pipe2(fds, O_NONBLOCK) == 0);
  Console console(fds[1]);
  console.write("before\n");
  console.setLiveLine("step 1/10");
  CHECK(readAll(fds[0]) == "before\n\rstep 1/10\x1b[K");
  console.setLiveLine("step 2/10");  // redrawn over itself
  CHECK(readAll(fds[0]) == "\rstep 2/10\x1b[K");
  console.setLiveLine("step 2/10");  // unchanged: nothing
  CHECK(readAll(fds[0]).empty());
  console.write("[rank 0]: hello\n");
  console.write("[rank 1]: hello\n");
  CHECK(readAll(fds[0]) == "\r\x1b[K[rank 0]: hello\n[rank 1]: hello\n");
  console.flush();  // the agent's, after each turn of its loop
  CHECK(readAll(fds[0]) == "\rstep 2/10\x1b[K");
  console.write("partial");  // not a whole line: no redraw until the line ends
  console.flush();
  CHECK(readAll(fds[0]) == "\r\x1b[Kpartial");
  console.write(" line\n");
  console.flush();
  CHECK(readAll(fds[0]) == " line\n\rstep 2/10\x1b[K");
  console.endLiveLine();  // stays, as a line of its own
  console.write("after\n");
  CHECK(readAll(fds[0]) == "\nafter\n");
  ::close(fds[0]);
  ::close(fds[1]);
}
