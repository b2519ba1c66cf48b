// Checkpoints in real processes: the example trainer under `cxxlaunch run` saves every N steps
// (--save_every) into the launch's checkpoint folder (--checkpoint_dir) and resumes from it,
// after a job that died and after a restart of the worker group by --max_restarts. A resumed run
// must end with the parameters of a run that was never interrupted, bit for bit.

#include <catch2/catch.hpp>
#include <filesystem>

#include "support/subprocess.h"

using namespace cxxlaunch::testing;
using namespace std::chrono_literals;
using Args = std::vector<std::string>;
namespace fs = std::filesystem;

namespace {

struct Trained {
  Finished finished;
  std::string params;  // the trainer's --dump_params file
};

Trained train(const TempDir& dir, const std::string& name, int nproc, const Args& launch_flags,
              const Args& trainer_flags) {
  Args argv = {CXXLAUNCH_BIN, "run", "--nproc_per_node", std::to_string(nproc)};
  argv.insert(argv.end(), launch_flags.begin(), launch_flags.end());
  argv.insert(argv.end(), {TRAIN_BIN, "--model", "gpt", "--steps", "6", "--batch_size", "4",
                           "--seq_len", "16", "--d_model", "32", "--layers", "3", "--heads",
                           "2", "--print_every", "1", "--dump_params",
                           dir.path() + "/" + name + ".bin"});
  argv.insert(argv.end(), trainer_flags.begin(), trainer_flags.end());
  Trained t{run(argv, {{"CXXLAUNCH_STRATEGY", "zero3"}}, 240s), {}};
  if (fs::exists(dir.path() + "/" + name + ".bin")) {
    t.params = readFile(dir.path() + "/" + name + ".bin");
  }
  return t;
}

}  // namespace

TEST_CASE("A job that died resumes from its checkpoint and ends as if it never had",
          "[checkpoint][integration]") {
  TempDir dir;
  const Trained uninterrupted = train(dir, "uninterrupted", 2, {}, {});
  REQUIRE(uninterrupted.finished.exit_code == 0);
  REQUIRE(!uninterrupted.params.empty());

  const std::string folder = dir.path() + "/checkpoints";
  const Trained died = train(dir, "died", 2, {"--checkpoint_dir", folder},
                             {"--save_every", "3", "--crash_at_step", "4"});
  INFO(died.finished.out << died.finished.err);
  CHECK(died.finished.exit_code != 0);
  CHECK(fs::exists(folder + "/checkpoint_3/manifest"));

  const Trained resumed = train(dir, "resumed", 2, {"--checkpoint_dir", folder}, {});
  INFO(resumed.finished.out << resumed.finished.err);
  REQUIRE(resumed.finished.exit_code == 0);
  CHECK_THAT(resumed.finished.out, Catch::Contains("resumed from " + folder + "/checkpoint_3") &&
                                       Catch::Contains("at step 3"));
  CHECK_THAT(resumed.finished.out, !Catch::Contains("step    1/6"));
  CHECK(resumed.params == uninterrupted.params);
}

TEST_CASE("A worker group restarted by --max_restarts resumes by itself",
          "[checkpoint][integration]") {
  TempDir dir;
  const Trained uninterrupted = train(dir, "uninterrupted", 2, {}, {});
  REQUIRE(uninterrupted.finished.exit_code == 0);
  const std::string folder = dir.path() + "/checkpoints";
  const Trained restarted =
      train(dir, "restarted", 2, {"--max_restarts", "2", "--checkpoint_dir", folder},
            {"--save_every", "2", "--crash_at_step", "3"});
  INFO(restarted.finished.out << restarted.finished.err);
  REQUIRE(restarted.finished.exit_code == 0);
  CHECK_THAT(restarted.finished.out, Catch::Contains("resumed from " + folder + "/checkpoint_2"));
  CHECK(restarted.params == uninterrupted.params);
  // Checkpoints at steps 2, 4 and 6; the first attempt's step-2 one was saved again.
  for (const std::string step : {"2", "4", "6"}) {
    CHECK(fs::exists(folder + "/checkpoint_" + step + "/manifest"));
  }
}

TEST_CASE("A checkpoint of 4 workers resumes with 2", "[checkpoint][integration]") {
  TempDir dir;
  const std::string folder = dir.path() + "/checkpoints";
  const Trained four = train(dir, "four", 4, {"--checkpoint_dir", folder},
                             {"--save_every", "3", "--crash_at_step", "3"});
  CHECK(four.finished.exit_code != 0);
  const Trained two = train(dir, "two", 2, {"--checkpoint_dir", folder}, {});
  INFO(two.finished.out << two.finished.err);
  REQUIRE(two.finished.exit_code == 0);
  CHECK_THAT(two.finished.out, Catch::Contains("resumed from " + folder + "/checkpoint_3") &&
                                   Catch::Contains("step    6/6"));
}
