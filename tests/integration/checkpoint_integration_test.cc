// Checkpoints in real processes: the example trainer under `cxxlaunch run` saves every N steps
// (--save_every) into the launch's checkpoint folder (--checkpoint_dir) and resumes from it,
// after a job that died and after a restart of the worker group by --max_restarts. A resumed run
// must end with the parameters of a run that was never interrupted, bit for bit.

#include "runtime/checkpoint/checkpoint.h"  // first: LibTorch's logging (glog) defines CHECK
                                            // too, and Catch's, included after it, must win

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <set>

#include "support/daemon.h"
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

using Env = std::map<std::string, std::string>;

Trained train(const TempDir& dir, const std::string& name, int nproc, const Args& launch_flags,
              const Args& trainer_flags, const Env& env = {{"CXXLAUNCH_STRATEGY", "zero3"}}) {
  Args argv = {CXXLAUNCH_BIN, "run", "--nproc_per_node", std::to_string(nproc)};
  argv.insert(argv.end(), launch_flags.begin(), launch_flags.end());
  argv.insert(argv.end(),
              {TRAIN_BIN, "--model", "gpt", "--steps", "6", "--batch_size", "4", "--seq_len", "16",
               "--d_model", "32", "--layers", "3", "--heads", "2", "--print_every", "1",
               "--dump_params", dir.path() + "/" + name + ".bin"});
  argv.insert(argv.end(), trainer_flags.begin(), trainer_flags.end());
  Trained t{run(argv, env, 240s), {}};
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

TEST_CASE("Every strategy resumes bit for bit in real processes, in fp32 and bf16",
          "[checkpoint][integration]") {
  // The runtime's round-trip test, with the example trainer under `cxxlaunch run` at world 2: a
  // job saves at step 3 and ends at 6; a fresh job given a copy of that step-3 checkpoint trains
  // from 3 to 6, and its step-6 checkpoint (parameters, optimizer state, counters, generators,
  // the manifest) equals the first job's byte for byte.
  for (const std::string precision : {"no", "bf16"}) {
    for (const std::string strategy : {"ddp", "zero1", "zero2", "zero3", "fsdp_full_shard",
                                       "fsdp_shard_grad_op", "fsdp_no_shard"}) {
      INFO(strategy << " " << precision);
      TempDir dir;
      const Env env = {{"CXXLAUNCH_STRATEGY", strategy}, {"CXXLAUNCH_MIXED_PRECISION", precision}};
      auto job = [&](const std::string& name) {
        const Trained t = train(dir, name, 2, {"--checkpoint_dir", dir.path() + "/" + name},
                                {"--save_every", "3"}, env);
        INFO(t.finished.out << t.finished.err);
        REQUIRE(t.finished.exit_code == 0);
        return t;
      };
      const std::string first = dir.path() + "/first", second = dir.path() + "/second";
      const Trained uninterrupted = job("first");
      fs::create_directories(second);
      fs::copy(first + "/checkpoint_3", second + "/checkpoint_3", fs::copy_options::recursive);
      const Trained resumed = job("second");
      CHECK_THAT(resumed.finished.out, Catch::Contains("resumed from " + second + "/checkpoint_3"));
      CHECK(!resumed.params.empty());
      CHECK(resumed.params == uninterrupted.params);
      size_t files = 0;
      for (const auto& entry : fs::directory_iterator(first + "/checkpoint_6")) {
        const std::string name = entry.path().filename().string();
        INFO(name);
        CHECK(readFile(entry.path().string()) == readFile(second + "/checkpoint_6/" + name));
        ++files;
      }
      CHECK(files == 3);  // manifest, rank0.bin, rank1.bin
    }
  }
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

TEST_CASE("The launch's --checkpoint_total_limit keeps the newest complete checkpoints",
          "[checkpoint][integration]") {
  TempDir dir;
  const std::string folder = dir.path() + "/checkpoints";
  const Trained kept =
      train(dir, "kept", 2, {"--checkpoint_dir", folder, "--checkpoint_total_limit", "2"},
            {"--save_every", "1"});
  INFO(kept.finished.out << kept.finished.err);
  REQUIRE(kept.finished.exit_code == 0);
  std::set<std::string> left;
  for (const auto& entry : fs::directory_iterator(folder)) {
    left.insert(entry.path().filename().string());
  }
  const std::set<std::string> newest = {"checkpoint_5", "checkpoint_6"};
  CHECK(left == newest);
  // The config's key and the variable reach the workers the same way (worker_env); a limit
  // the launcher cannot take is one line and exit 2 before anything starts.
  const Finished bad = run(
      {CXXLAUNCH_BIN, "run", "--nproc_per_node", "2", "--checkpoint_total_limit", "-1", TRAIN_BIN},
      {}, 30s);
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("checkpoint_total_limit"));
}

TEST_CASE("train --load_again loads the newest checkpoint once more and needs a folder for it",
          "[checkpoint][integration]") {
  TempDir dir;
  const std::string folder = dir.path() + "/checkpoints";
  const Trained again =
      train(dir, "again", 2, {"--checkpoint_dir", folder}, {"--save_every", "4", "--load_again"});
  INFO(again.finished.out << again.finished.err);
  REQUIRE(again.finished.exit_code == 0);
  CHECK_THAT(again.finished.out, Catch::Contains("loaded again " + folder + "/checkpoint_4 ("));
  // The parameters dumped at the end are the step-4 checkpoint's (as a job resumed from it that
  // stops there dumps them), not those trained to step 6.
  const Trained four =
      train(dir, "four", 2, {"--checkpoint_dir", folder}, {"--steps", "4", "--save_every", "0"});
  INFO(four.finished.out << four.finished.err);
  REQUIRE(four.finished.exit_code == 0);
  CHECK(!four.params.empty());
  CHECK(again.params == four.params);

  const Trained nowhere = train(dir, "nowhere", 1, {}, {"--load_again"});
  CHECK(nowhere.finished.exit_code == 2);
  CHECK_THAT(nowhere.finished.err,
             Catch::Contains("--load_again") && Catch::Contains("--checkpoint_dir"));
}

TEST_CASE("On a file system that refuses O_DIRECT (ramfs) checkpoints save and resume",
          "[checkpoint][integration]") {
  // Rank files are written and read past the page cache where the file system allows it;
  // ramfs refuses O_DIRECT at open, so both sides take the page cache. The folder is a ramfs
  // mounted in a mount namespace of the test's own (as root, or as root of a user namespace),
  // which holds both jobs and vanishes with them. Arrays of 64 KiB and more (d_model 128) are
  // the ones a load would read past the page cache.
  TempDir dir;
  const Args wider = {"--d_model", "128"};
  const Trained uninterrupted = train(dir, "uninterrupted", 2, {}, wider);
  REQUIRE(uninterrupted.finished.exit_code == 0);
  const std::string folder = dir.path() + "/ramfs";
  fs::create_directory(folder);
  auto job = [&](const std::string& name, const Args& flags) {
    std::string line = "'" CXXLAUNCH_BIN "' run --nproc_per_node 2 --checkpoint_dir '" + folder +
                       "' '" TRAIN_BIN
                       "' --model gpt --steps 6 --batch_size 4 --seq_len 16"
                       " --d_model 128 --layers 3 --heads 2 --print_every 1 --dump_params '" +
                       dir.path() + "/" + name + ".bin'";
    for (const auto& flag : flags) line += " " + flag;
    return line;
  };
  const std::string script =
      "set -e; mount -t ramfs none '" + folder + "'; " + "if dd if=/dev/zero of='" + folder +
      "/probe' bs=4096 count=1 oflag=direct 2>/dev/null; " +
      "then echo 'O_DIRECT taken'; else echo 'O_DIRECT refused'; fi; rm -f '" + folder +
      "/probe'; " + job("died", {"--save_every", "3", "--crash_at_step", "4"}) +
      " || echo \"died with $?\"; test -f '" + folder + "/checkpoint_3/manifest'; " +
      job("resumed", {});
  const Args unshare = ::geteuid() == 0
                           ? Args{"/usr/bin/unshare", "--mount", "--propagation", "private"}
                           : Args{"/usr/bin/unshare", "--user", "--map-root-user", "--mount"};
  Args argv = unshare;
  argv.insert(argv.end(), {"sh", "-c", script});
  const Finished both = run(argv, {{"CXXLAUNCH_STRATEGY", "zero3"}}, 240s);
  INFO(both.out << both.err);
  REQUIRE(both.exit_code == 0);
  CHECK_THAT(both.out, Catch::Contains("O_DIRECT refused"));
  CHECK_THAT(both.out, Catch::Contains("died with"));
  CHECK_THAT(both.out, Catch::Contains("resumed from " + folder + "/checkpoint_3") &&
                           Catch::Contains("at step 3"));
  CHECK(readFile(dir.path() + "/resumed.bin") == uninterrupted.params);
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

namespace {

std::vector<pid_t> childrenOf(pid_t pid) {
  std::vector<pid_t> out;
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  for (pid_t child; in >> child;) out.push_back(child);
  return out;
}

int64_t stepOf(const std::string& dir) {
  const std::string name = fs::path(dir).filename().string();
  return std::stoll(name.substr(name.find('_') + 1));
}

// Trials of SIGKILL at random instants of a job that saves a checkpoint after every step: the
// whole job (launcher and workers at once) or one worker. After each, the folder's newest
// complete checkpoint must be byte for byte the one an undisturbed run saved at that step, and
// a job killed by losing a worker must end in bounded time. `async`: the trials' saves are
// asynchronous (--checkpoint_async), killed while snapshotting, writing in the background or
// committing; the reference's are synchronous, and the files must be the same.
void killDuringSaves(int trials, bool async = false) {
  TempDir dir;
  const Args flags = {"--save_every", "1", "--steps", "120", "--warmup", "0"};
  const std::string reference = dir.path() + "/reference";
  const Trained undisturbed = train(dir, "reference", 2, {"--checkpoint_dir", reference}, flags);
  REQUIRE(undisturbed.finished.exit_code == 0);

  std::mt19937 random(20261201);
  int recovered = 0, without_checkpoint = 0, inside_a_save = 0;
  for (int t = 0; t < trials; ++t) {
    const std::string folder = dir.path() + "/trial" + std::to_string(t);
    Args argv = {CXXLAUNCH_BIN,
                 "run",
                 "--nproc_per_node",
                 "2",
                 "--checkpoint_dir",
                 folder,
                 TRAIN_BIN,
                 "--model",
                 "gpt",
                 "--batch_size",
                 "4",
                 "--seq_len",
                 "16",
                 "--d_model",
                 "32",
                 "--layers",
                 "3",
                 "--heads",
                 "2",
                 "--print_every",
                 "1000"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    if (async) argv.insert(std::find(argv.begin(), argv.end(), TRAIN_BIN), "--checkpoint_async");
    Subprocess job(argv, {{"CXXLAUNCH_STRATEGY", "zero3"}});  // as the reference
    REQUIRE(eventually([&] { return fs::exists(folder); }, 60s));
    sleepFor(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 400)(random)));
    const bool whole_job = t % 3 != 2;
    auto workers = childrenOf(job.pid());
    if (whole_job) {
      for (pid_t w : workers) ::kill(w, SIGKILL);
      ::kill(job.pid(), SIGKILL);
    } else if (!workers.empty()) {
      ::kill(workers[std::uniform_int_distribution<size_t>(0, workers.size() - 1)(random)],
             SIGKILL);
    }
    auto ended = job.wait(60s);
    INFO("trial " << t << (whole_job ? ": the whole job" : ": one worker"));
    REQUIRE(ended);            // no hang
    for (pid_t w : workers) {  // nothing left behind by the job
      CHECK(eventually([&] { return !alive(w); }, 10s));
    }
    for (const auto& entry : fs::directory_iterator(folder)) {
      const std::string name = entry.path().filename().string();
      if (name.size() > 4 && name.substr(name.size() - 4) == ".tmp") ++inside_a_save;
    }
    std::string found;
    try {
      found = cxxlaunch::tensorfile::find(folder);
    } catch (const std::exception&) {
      ++without_checkpoint;  // killed before its first save completed
      continue;
    }
    const std::string same = reference + "/checkpoint_" + std::to_string(stepOf(found));
    for (const std::string file : {"manifest", "rank0.bin", "rank1.bin"}) {
      CHECK(readFile(found + "/" + file) == readFile(same + "/" + file));
    }
    ++recovered;
  }
  // Report the figures (ctest --output-on-failure -V shows them).
  std::cout << "kill during " << (async ? "asynchronous " : "") << "saves: " << trials
            << " trials, " << recovered << " recovered the newest complete checkpoint intact, "
            << inside_a_save << " were killed inside a save (its staging directory left), "
            << without_checkpoint << " before their first checkpoint; 0 corrupt loads, 0 hangs\n";
  CHECK(recovered > trials / 2);
}

}  // namespace

TEST_CASE("SIGKILL during saves: the newest complete checkpoint is always intact (20 trials)",
          "[checkpoint][integration]") {
  killDuringSaves(20);
}

TEST_CASE("SIGKILL during saves, 200 trials", "[.kill_soak]") { killDuringSaves(200); }

TEST_CASE("SIGKILL during asynchronous saves: the newest complete checkpoint is always intact",
          "[checkpoint][integration]") {
  killDuringSaves(15, /*async=*/true);
}

TEST_CASE("SIGKILL during asynchronous saves, 200 trials", "[.kill_soak]") {
  killDuringSaves(200, /*async=*/true);
}

TEST_CASE("With --checkpoint_async a job that died resumes and ends as if it never had",
          "[checkpoint][integration]") {
  // Every save is reported once committed, with the time training was blocked; the checkpoints
  // and the end are those of a job that saves synchronously.
  TempDir dir;
  const std::string sync_folder = dir.path() + "/sync", folder = dir.path() + "/async";
  const Trained sync =
      train(dir, "sync", 2, {"--checkpoint_dir", sync_folder}, {"--save_every", "2"});
  REQUIRE(sync.finished.exit_code == 0);
  // The line of a save, in both modes: "saved DIR (0.001 GB in 0.012 s, training blocked 0.012 s)".
  auto saveLine = [](const std::string& out, const std::string& dir) {
    const auto at = out.find("saved " + dir + " (");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  const std::string format = "saved .* \\([0-9.]+ GB in [0-9.]+ s, training blocked [0-9.]+ s\\)";
  CHECK_THAT(saveLine(sync.finished.out, sync_folder + "/checkpoint_2"), Catch::Matches(format));
  const Trained whole = train(dir, "whole", 2, {"--checkpoint_dir", folder, "--checkpoint_async"},
                              {"--save_every", "2"});
  INFO(whole.finished.out << whole.finished.err);
  REQUIRE(whole.finished.exit_code == 0);
  for (const std::string step : {"2", "4", "6"}) {
    CHECK_THAT(saveLine(whole.finished.out, folder + "/checkpoint_" + step),
               Catch::Matches(format));
    for (const std::string file : {"manifest", "rank0.bin", "rank1.bin"}) {
      CHECK(readFile(folder + "/checkpoint_" + step + "/" + file) ==
            readFile(sync_folder + "/checkpoint_" + step + "/" + file));
    }
  }
  CHECK_THAT(whole.finished.out, Catch::Contains("step time while a checkpoint was written"));
  CHECK(whole.params == sync.params);

  // A job that dies after its step-4 save began: step 2's (or, if it was committed, 4's) resumes.
  fs::remove_all(folder);
  const Trained died = train(dir, "died", 2, {"--checkpoint_dir", folder, "--checkpoint_async"},
                             {"--save_every", "2", "--crash_at_step", "4"});
  CHECK(died.finished.exit_code != 0);
  const Trained resumed =
      train(dir, "resumed", 2, {"--checkpoint_dir", folder, "--checkpoint_async"}, {});
  INFO(resumed.finished.out << resumed.finished.err);
  REQUIRE(resumed.finished.exit_code == 0);
  CHECK_THAT(resumed.finished.out, Catch::Contains("resumed from " + folder + "/checkpoint_"));
  CHECK(resumed.params == sync.params);
}

TEST_CASE("An elastic 2:3 job that loses a node resumes at world 2 from its last checkpoint",
          "[checkpoint][integration]") {
  Daemon daemon;
  TempDir dir;
  const std::string folder = dir.path() + "/checkpoints";
  const Args launch = {"run",
                       "--rdzv_endpoint",
                       daemon.endpoint,
                       "--rdzv_id",
                       "elastic",
                       "--rdzv_conf",
                       "keep_alive_interval=0.3,keep_alive_max_misses=7,last_call_timeout=1",
                       "--nnodes",
                       "2:3",
                       "--nproc_per_node",
                       "1",
                       "--max_restarts",
                       "3",
                       "--checkpoint_dir",
                       folder};
  const Args trainer = {"--model",      "gpt", "--steps",   "400", "--warmup",      "0",
                        "--batch_size", "4",   "--seq_len", "32",  "--d_model",     "64",
                        "--layers",     "2",   "--heads",   "2",   "--print_every", "50",
                        "--save_every", "20"};
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int n = 0; n < 3; ++n) {
    Args argv = {CXXLAUNCH_BIN};
    argv.insert(argv.end(), launch.begin(), launch.end());
    argv.push_back(TRAIN_BIN);
    argv.insert(argv.end(), trainer.begin(), trainer.end());
    nodes.push_back(std::make_unique<Subprocess>(argv));
  }
  // Once the world of three has saved, one node dies with its worker; the survivors' workers
  // lose a peer mid-collective, and their agents restart them (as torchrun's would) in the
  // world that is left.
  REQUIRE(eventually([&] { return fs::exists(folder + "/checkpoint_40/manifest"); }, 120s));
  for (pid_t worker : childrenOf(nodes[2]->pid())) ::kill(worker, SIGKILL);
  ::kill(nodes[2]->pid(), SIGKILL);
  std::string out;
  for (int n = 0; n < 2; ++n) {
    auto finished = nodes[static_cast<size_t>(n)]->wait(240s);
    REQUIRE(finished);
    INFO(finished->out << finished->err);
    CHECK(finished->exit_code == 0);
    out += finished->out;
  }
  // The survivors restarted as a world of two and went on from a checkpoint of the three.
  CHECK_THAT(out, Catch::Contains("on 2 process(es)") && Catch::Contains("on 3 process(es)"));
  CHECK_THAT(out, Catch::Contains("resumed from " + folder + "/checkpoint_"));
  CHECK_THAT(out, Catch::Contains("step  400/400"));
}
