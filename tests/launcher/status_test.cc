// `cxxlaunch status`'s text: nodes, then each worker's state and last progress, silent ones
// flagged.

#include "launcher/status.h"

#include <catch2/catch.hpp>
#include <sstream>

#include "support/status_rows.h"

using namespace cxxlaunch::launcher;
using namespace cxxlaunch::rendezvous;
using namespace std::chrono_literals;

namespace {

RunStatus runningWith(std::vector<WorkerProgress> workers) {
  RunStatus s;
  s.round = 1;
  s.state = "running";
  NodeState n;
  n.spec.id = "10.0.0.1_77_abc";
  n.spec.addr = "10.0.0.1";
  n.spec.local_world_size = static_cast<int>(workers.size());
  n.node_rank = 0;
  n.heartbeat_age = 300ms;
  n.workers = std::move(workers);
  s.participants.push_back(n);
  return s;
}

}  // namespace

TEST_CASE("Status shows each worker's last progress and flags the silent ones", "[status]") {
  const auto text = formatRunStatus("job", "h:1",
                                    runningWith({{0, 0, 501, "sleeping", 200ms},
                                                 {1, 1, 502, "stopped", 75s},
                                                 {2, 2, 503, "running", std::nullopt},
                                                 {3, 3, 504, "exited", 90s}}),
                                    60s);
  INFO(text);
  CHECK_THAT(text, Catch::Contains("silent: no progress for 60.0 s or more"));
  CHECK_THAT(cxxlaunch::testing::workerRow(text, 0),
             Catch::Contains("501") && Catch::Contains("sleeping") && Catch::Contains("0.2 s ago"));
  CHECK_THAT(cxxlaunch::testing::workerRow(text, 0), !Catch::Contains("SILENT"));
  CHECK_THAT(cxxlaunch::testing::workerRow(text, 1),
             Catch::Contains("stopped") && Catch::Contains("75.0 s ago  SILENT"));
  CHECK_THAT(cxxlaunch::testing::workerRow(text, 2), Catch::Contains("never (no heartbeat"));
  CHECK_THAT(cxxlaunch::testing::workerRow(text, 3),
             Catch::Contains("exited") && !Catch::Contains("SILENT"));
  CHECK_THAT(text, Catch::Contains("1 worker has made no progress for 60.0 s or more"));
}

TEST_CASE("Status without worker reports shows no workers table", "[status]") {
  const auto text = formatRunStatus("job", "h:1", runningWith({}), 60s);
  CHECK_THAT(text, Catch::Contains("round 1: running"));
  CHECK_THAT(text, !Catch::Contains("workers ("));
}
