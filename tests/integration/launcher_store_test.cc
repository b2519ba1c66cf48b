// The store a single-node launcher gives its workers: its server starts gRPC when the first
// worker connects (rendezvous/server.h, start_on_first_connection), and every worker's first
// call is served, however early it comes.

#include <catch2/catch.hpp>
#include <string>

#include "support/subprocess.h"

using namespace cxxlaunch::testing;
using namespace std::chrono_literals;

TEST_CASE("Workers that use the store at once all reach it and see each other's keys",
          "[launcher][integration][store]") {
  TempDir dir;
  // Several launches: the workers' first calls land before, while and after gRPC starts.
  for (int launch = 0; launch < 5; ++launch) {
    auto r =
        run({CXXLAUNCH_BIN, "run", "--log_dir", dir.path(), "--nproc_per_node=4", STORE_WORKER}, {},
            60s);
    INFO("launch " << launch << ": " << r.err);
    REQUIRE(r.exit_code == 0);
    for (int rank = 0; rank < 4; ++rank) {
      CHECK_THAT(r.out,
                 Catch::Contains("[rank " + std::to_string(rank) +
                                 "]: hello from 0, hello from 1, hello from 2, hello from 3"));
    }
  }
}
