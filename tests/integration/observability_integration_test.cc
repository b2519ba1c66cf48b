// Observability under `cxxlaunch run`, in real processes: the evaluation helpers at worlds 2
// and 3 (eval_worker checks closed forms), the example trainer's trackers (only rank 0 writes;
// every file holds the same values; TensorBoard's file read back independently), and the bad
// input: an unknown tracker, a project folder that cannot be written.

#include <dirent.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "support/subprocess.h"
#include "support/text_lines.h"

using namespace cxxlaunch::testing;
using namespace std::chrono_literals;
using Args = std::vector<std::string>;

namespace {

Finished launch(const Args& flags, const std::string& program, const Args& args) {
  Args argv = {CXXLAUNCH_BIN, "run"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(program);
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv, {}, 240s);
}

std::string eventFileIn(const std::string& dir) {
  std::string found;
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind("events.out.tfevents.", 0) == 0) found = dir + "/" + name;
    }
    closedir(d);
  }
  return found;
}

}  // namespace

TEST_CASE("Evaluation helpers give each example once, in order, at worlds 2 and 3",
          "[observability][integration]") {
  // Sizes not divisible by world * batch (padding of 1 to 8 examples), divisible ones, a dataset
  // smaller than one batch of every rank, and an empty one.
  for (const int world : {2, 3}) {
    auto r = launch({"--nproc_per_node", std::to_string(world)}, EVAL_WORKER_BIN,
                    {"11:4", "10:3", "16:4", "2:4", "1:1", "0:2", "37:5"});
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);
    for (int rank = 0; rank < world; ++rank) {
      CHECK_THAT(r.out, Catch::Contains("rank " + std::to_string(rank) + ": eval ok"));
    }
  }
}

TEST_CASE("The example trainer logs to every tracker from rank 0 only",
          "[observability][integration]") {
  TempDir dir;
  const std::string project = dir.path() + "/project";
  const int steps = 6;
  auto r = launch(
      {"--nproc_per_node", "2", "--log_with", "tensorboard,csv,jsonl", "--project_dir", project},
      TRAIN_BIN,
      {"--model", "mlp", "--steps", std::to_string(steps), "--warmup", "1", "--run_name",
       "mlp-run"});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("report: " + project + "/report.html"));
  const std::string run_dir = project + "/mlp-run";
  const std::vector<std::string> names = {"loss",
                                          "lr",
                                          "tokens_per_s",
                                          "step_time_ms",
                                          "memory/parameters_mib",
                                          "memory/gradients_mib",
                                          "memory/optimizer_state_mib",
                                          "memory/model_state_mib"};
  // The GPU's peak is logged only where there is one: never as a series of zeros.
  const std::string device_peak = "memory/device_peak_mib";
  bool on_gpu = false;

  // JSON lines: one object per step, every name, and the values the CSV and TensorBoard hold.
  const auto jsonl = lines(readFile(run_dir + "/metrics.jsonl"));
  REQUIRE(jsonl.size() == steps);  // rank 1 wrote nothing
  std::map<std::pair<int64_t, std::string>, double> values;
  for (int i = 0; i < steps; ++i) {
    const auto j = nlohmann::json::parse(jsonl[static_cast<size_t>(i)]);
    CHECK(j["step"] == i + 1);
    for (const auto& name : names) {
      REQUIRE(j.contains(name));
      values[{i + 1, name}] = j[name].get<double>();
    }
    CHECK(j["loss"].get<double>() > 0);
    CHECK(j["tokens_per_s"].get<double>() > 0);
    CHECK(j["memory/parameters_mib"].get<double>() > 0);
    if (i == 0) on_gpu = j.contains(device_peak);
    CHECK(j.contains(device_peak) == on_gpu);
    if (on_gpu) {
      CHECK(j[device_peak].get<double>() > 0);
      values[{i + 1, device_peak}] = j[device_peak].get<double>();
    }
  }
  const auto csv = lines(readFile(run_dir + "/metrics.csv"));
  REQUIRE(csv.size() == 1 + steps * (names.size() + (on_gpu ? 1 : 0)));
  for (size_t i = 1; i < csv.size(); ++i) {
    std::vector<std::string> cells;
    std::istringstream in(csv[i]);
    for (std::string cell; std::getline(in, cell, ',');) cells.push_back(cell);
    REQUIRE(cells.size() == 4);
    CHECK(std::stod(cells[3]) == values.at({std::stoll(cells[0]), cells[2]}));
  }
  const auto events = eventFileIn(run_dir);
  REQUIRE(!events.empty());
  const auto tb = run({"/usr/bin/python3", READ_TFEVENTS_PY, events});
  INFO(tb.err);
  REQUIRE(tb.exit_code == 0);
  const auto tb_lines = lines(tb.out);
  REQUIRE(tb_lines.size() == 2 + steps * (names.size() + (on_gpu ? 1 : 0)));
  for (size_t i = 2; i < tb_lines.size(); ++i) {
    std::istringstream in(tb_lines[i]);
    int64_t step = 0;
    std::string name;
    double value = 0;
    in >> step >> name >> value;
    const double want = values.at({step, name});
    CHECK(value == Approx(static_cast<float>(want)).epsilon(1e-6).margin(1e-30));
  }

  const auto config = nlohmann::json::parse(readFile(run_dir + "/config.json"));
  CHECK(config["model"] == "mlp");
  CHECK(config["steps"] == steps);
  CHECK(config["launch.world_size"] == 2);
  CHECK(config["launch.strategy"] == "ddp");

  const auto report = readFile(project + "/report.html");
  CHECK_THAT(report, Catch::Contains("class=\"finished\""));
  for (const auto& name : names) CHECK_THAT(report, Catch::Contains("<h3>" + name + "</h3>"));
  CHECK((report.find("<h3>" + device_peak + "</h3>") != std::string::npos) == on_gpu);
  CHECK_THAT(report, Catch::Contains("launch.world_size"));
}

TEST_CASE("An unknown tracker is one error listing the known ones, before anything runs",
          "[observability][integration]") {
  TempDir dir;
  auto r =
      launch({"--nproc_per_node", "2", "--log_with", "tensorbord,csv", "--project_dir", dir.path()},
             TRAIN_BIN, {"--model", "mlp", "--steps", "2", "--warmup", "1"});
  INFO(r.out << r.err);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("unknown tracker 'tensorbord' (did you mean 'tensorboard'?)"));
  CHECK_THAT(r.err, Catch::Contains("tensorboard, csv and jsonl"));
  CHECK_THAT(r.err, Catch::Contains("--log_with"));
  CHECK(r.out.find("training") == std::string::npos);  // no worker started
}

TEST_CASE("A project folder that cannot be written stops the run at initTrackers",
          "[observability][integration]") {
  TempDir dir;
  std::ofstream(dir.path() + "/file") << "x";  // a file where the folder would go (even root)
  const std::string project = dir.path() + "/file/runs";
  auto r = launch({"--nproc_per_node", "2", "--log_with", "csv", "--project_dir", project},
                  TRAIN_BIN, {"--model", "mlp", "--steps", "50", "--warmup", "1"});
  INFO(r.out << r.err);
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.out + r.err, Catch::Contains("'" + project + "' cannot be written"));
  CHECK(r.out.find("step ") == std::string::npos);  // before the first step, not at the end
  CHECK(r.out.find("done:") == std::string::npos);
}
