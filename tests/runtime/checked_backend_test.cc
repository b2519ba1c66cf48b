// CheckedBackend over the Fake backend (ranks as threads): in debug mode a mismatched collective
// fails at once on every rank, naming each rank's call; without it, a timed-out collective's
// error names the rank that was behind, and lists this rank's last collectives.

#include "runtime/comm/checked_backend.h"

#include <sys/stat.h>

#include <array>
#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/heartbeat_record.h"
#include "rendezvous/memory_store.h"
#include "support/ranks.h"
#include "support/subprocess.h"

using namespace cxxlaunch::runtime;
using cxxlaunch::testing::onRanks;

TEST_CASE("Debug mode: rank 1 all-reduces 10 elements, rank 0 11: both fail at once, naming both",
          "[checked_backend]") {
  auto world = makeFakeWorld(2);
  std::vector<std::string> errors(2);
  const auto start = std::chrono::steady_clock::now();
  onRanks(2, [&](int rank) {
    CheckOptions options;
    options.debug = true;
    auto backend = makeCheckedBackend(makeFakeBackend(world, rank), options);
    std::vector<float> data(11, 1.f);
    backend->allreduce(data.data(), 11, DType::kFloat32, ReduceOp::kSum)->wait();  // alike: fine
    try {
      backend->allreduce(data.data(), rank == 1 ? 10 : 11, DType::kFloat32, ReduceOp::kSum)->wait();
    } catch (const cxxlaunch::CommunicationError& e) {
      errors[static_cast<size_t>(rank)] = e.what();
    }
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds < 2);
  for (const auto& error : errors) {
    CHECK_THAT(error, Catch::Contains("the ranks called different collectives at #2"));
    CHECK_THAT(error, Catch::Contains("rank 0: #2 allreduce float32 x11"));
    CHECK_THAT(error, Catch::Contains("rank 1: #2 allreduce float32 x10"));
  }
}

TEST_CASE("Debug mode tells an all-gather from an all-reduce of the same size",
          "[checked_backend]") {
  auto world = makeFakeWorld(2);
  std::vector<std::string> errors(2);
  onRanks(2, [&](int rank) {
    CheckOptions options;
    options.debug = true;
    auto backend = makeCheckedBackend(makeFakeBackend(world, rank), options);
    std::vector<float> in(4, 1.f), out(8);
    try {
      if (rank == 0) {
        backend->allGather(in.data(), out.data(), 4, DType::kFloat32)->wait();
      } else {
        backend->allreduce(in.data(), 4, DType::kFloat32, ReduceOp::kSum)->wait();
      }
    } catch (const cxxlaunch::CommunicationError& e) {
      errors[static_cast<size_t>(rank)] = e.what();
    }
  });
  for (const auto& error : errors) {
    CHECK_THAT(error, Catch::Contains("rank 0: #1 allGather float32 x4"));
    CHECK_THAT(error, Catch::Contains("rank 1: #1 allreduce float32 x4"));
  }
}

TEST_CASE("A timed-out collective names the rank that was behind and its own history",
          "[checked_backend]") {
  auto world = makeFakeWorld(2);
  auto store = std::make_shared<cxxlaunch::rendezvous::MemoryStore>();
  std::string error;
  onRanks(2, [&](int rank) {
    CheckOptions options;
    options.store = store;
    options.report_wait = std::chrono::milliseconds(300);
    auto backend = makeCheckedBackend(makeFakeBackend(world, rank), options);
    std::vector<float> data(5, 1.f);
    backend->allreduce(data.data(), 5, DType::kFloat32, ReduceOp::kSum)->wait();
    if (rank == 1) {  // busy elsewhere, past rank 0's patience; then it catches up
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      backend->barrier()->wait();
      return;
    }
    auto work = backend->barrier();
    try {
      work->wait(std::chrono::milliseconds(200));
    } catch (const cxxlaunch::TimeoutError& e) {
      error = e.what();
    }
    work->wait();  // rank 1 arrives: the barrier completes, the world can end
  });
  CHECK_THAT(error, Catch::Contains("rank 0 timed out in #2 barrier"));
  CHECK_THAT(error, Catch::Contains("rank 1: no report (behind"));
  CHECK_THAT(error, Catch::Contains("#1 allreduce float32 x5"));
  CHECK_THAT(error, Catch::Contains("#2 barrier  (not completed)"));
}

TEST_CASE("A collective waiting for a late peer keeps beating the heartbeat", "[checked_backend]") {
  cxxlaunch::testing::TempDir dir;
  const std::string file = dir.path() + "/heartbeat";
  auto heartbeat = std::make_shared<Heartbeat>(file);
  auto world = makeFakeWorld(2);
  onRanks(2, [&](int rank) {
    CheckOptions options;
    if (rank == 0) options.heartbeat = heartbeat;
    auto backend = makeCheckedBackend(makeFakeBackend(world, rank), options);
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // late
    backend->barrier()->wait();
  });
  struct stat st {};
  REQUIRE(::stat(file.c_str(), &st) == 0);  // created by the first beat, during the wait
  const auto beat = std::chrono::system_clock::time_point(
      std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec));
  // Beaten every second of the 2.5 s wait: the last beat is at most about a second old.
  CHECK(std::chrono::system_clock::now() - beat < std::chrono::milliseconds(1500));
}

TEST_CASE("The time a rank waits in collectives for a late peer is counted on its thread",
          "[checked_backend][heartbeat]") {
  auto world = makeFakeWorld(2);
  std::array<std::chrono::nanoseconds, 2> waited{};
  onRanks(2, [&](int rank) {
    auto backend = makeCheckedBackend(makeFakeBackend(world, rank), CheckOptions{});
    const auto before = collectiveWaitOnThisThread();
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // late
    backend->barrier()->wait();
    waited[static_cast<size_t>(rank)] = collectiveWaitOnThisThread() - before;
  });
  // Rank 0 waited for rank 1 to arrive; rank 1 only for the barrier itself.
  CHECK(waited[0] >= std::chrono::milliseconds(250));
  CHECK(waited[1] < waited[0]);
}

TEST_CASE("The heartbeat's record holds the steps, the total, the loss and the step times",
          "[heartbeat]") {
  cxxlaunch::testing::TempDir dir;
  const std::string file = dir.path() + "/heartbeat";
  {
    Heartbeat heartbeat(file);
    heartbeat.setTotalSteps(3);
    heartbeat.beat();
    // The first step starts the clock (its time would hold the start-up), with 40 ms of waits
    // before it (prepare's broadcasts) that are not the next step's.
    heartbeat.stepDone(1, std::chrono::milliseconds(40));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    heartbeat.stepDone(2, std::chrono::milliseconds(40));
    heartbeat.setLoss(0.25);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    // 30 ms of the third step were spent waiting for peers: not this rank's work.
    heartbeat.stepDone(3, std::chrono::milliseconds(70));
    // The last step is written at once, not at the next beat.
    const auto last = cxxlaunch::readHeartbeatRecord(file);
    REQUIRE(last);
    CHECK(last->steps == 3);
    CHECK(last->total == 3);
    CHECK(last->loss == 0.25);
    CHECK(last->step_us >= 50000);
    CHECK(last->step_us - last->work_us == 15000);  // the mean of 0 and 30 ms of waiting
  }
  Heartbeat unwatched("");  // nobody watches: nothing to write, nothing written
  unwatched.stepDone(1, std::chrono::milliseconds(0));
  CHECK(unwatched.record().steps == 0);
}
