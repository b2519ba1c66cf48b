#pragma once
// The finetune integration tests' fixtures: a tiny llama_init folder (hidden 64, 2 layers, a
// vocabulary of 300), a text of one repeated sentence, an accelerate YAML, finetune's command
// line and its printed eval figures.

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "support/subprocess.h"

namespace cxxlaunch::testing::finetune {

using Args = std::vector<std::string>;
using namespace std::chrono_literals;

inline const Args kTiny = {"--hidden_size",         "64", "--intermediate_size",   "128",
                           "--num_hidden_layers",   "2",  "--num_attention_heads", "4",
                           "--num_key_value_heads", "2",  "--vocab_size",          "300"};

inline std::string fixture(const TempDir& dir, const std::string& name, const Args& extra) {
  const std::string path = dir.path() + "/" + name;
  Args argv = {LLAMA_INIT_BIN, "--output_dir", path};
  argv.insert(argv.end(), kTiny.begin(), kTiny.end());
  argv.insert(argv.end(), extra.begin(), extra.end());
  const Finished init = run(argv);
  INFO(init.out << init.err);
  REQUIRE(init.exit_code == 0);
  return path;
}

// One sentence over and over: a model learns it within a few steps.
inline std::string writeText(const TempDir& dir, int repeats) {
  const std::string path = dir.path() + "/text.txt";
  std::ofstream out(path);
  for (int i = 0; i < repeats; ++i) out << "The quick brown fox jumps over the lazy dog.\n";
  return path;
}

inline std::string writeConfig(const TempDir& dir, const std::string& name,
                               const std::string& body) {
  const std::string path = dir.path() + "/" + name + ".yaml";
  std::ofstream(path) << "compute_environment: LOCAL_MACHINE\nuse_cpu: true\nnum_machines: 1\n"
                         "num_processes: 2\n"
                      << body;
  return path;
}

inline Args finetuneArgs(const std::string& model, const std::string& data, int steps,
                         const std::string& out) {
  Args args = {FINETUNE_BIN, "--model_dir", model, "--data", data, "--steps", std::to_string(steps),
               "--seq_len", "32", "--lr", "3e-3", "--batch_size", "4", "--print_every", "1",
               // The recipe these tests were written for: a constant lr, the config's clipping
               // (none); Trainer's defaults are a linear decay and clipping at 1.0.
               "--lr_scheduler_type", "constant", "--max_grad_norm", "0"};
  if (!out.empty()) args.insert(args.end(), {"--output_dir", out});
  return args;
}

inline Finished launch(const std::string& config, const Args& finetune,
                       const std::map<std::string, std::string>& env = {},
                       const Args& launcher = {}) {
  Args argv = {CXXLAUNCH_BIN, "run", "--nproc_per_node", "2", "--config_file", config};
  argv.insert(argv.end(), launcher.begin(), launcher.end());
  argv.insert(argv.end(), finetune.begin(), finetune.end());
  return run(argv, env, 120s);
}

// The figures of the `eval loss L perplexity P` lines, in order.
inline std::vector<double> evalLosses(const std::string& out) {
  std::vector<double> losses;
  const std::regex line(R"(eval loss ([0-9.]+) perplexity ([0-9.]+))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator();
       ++it) {
    const double loss = std::stod((*it)[1]);
    CHECK(std::stod((*it)[2]) == Approx(std::exp(loss)).epsilon(1e-3));
    losses.push_back(loss);
  }
  return losses;
}

}  // namespace cxxlaunch::testing::finetune
