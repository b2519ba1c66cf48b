// finetune and llama_init against what a careless user or an adversarial probe gives them (issue
// 48's items 6, 8, 9, 13, 14, 15, 20, 21, 22): FIFOs where files should be, output folders that
// cannot take the result, configs whose sizes are absurd, a full disk; and the launcher's
// checkpoint settings, honoured. Each is one `error:` line, exit 2 (1 for the full disk), at once,
// with nothing written or left behind; and the figures finetune prints say what they are.

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "integration/finetune_fixture.h"
#include "support/subprocess.h"

using namespace cxxlaunch::testing;
using namespace cxxlaunch::testing::finetune;
namespace fs = std::filesystem;

namespace {

// A refusal: exit 2, one `error:` line holding `said`, no library text, no training begun.
void requireRefused(const Finished& done, const std::string& said) {
  INFO(done.out << done.err);
  CHECK(done.exit_code == 2);
  CHECK_THAT(done.err, Catch::Contains("error: ") && Catch::Contains(said));
  CHECK_THAT(done.out + done.err,
             !Catch::Contains("json.exception") && !Catch::Contains("filesystem error") &&
                 !Catch::Contains("Exception raised from") && !Catch::Contains("step "));
}

// A copy of the fixture folder `model` under `name` (its files, not links to them).
std::string copyModel(const TempDir& dir, const std::string& model, const std::string& name) {
  const std::string copy = dir.path() + "/" + name;
  fs::copy(model, copy, fs::copy_options::recursive);
  return copy;
}

// Replaces `path` with a FIFO nobody writes to.
void makeFifo(const std::string& path) {
  fs::remove(path);
  REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
}

// Runs argv with files limited to `kib` KiB and SIGXFSZ ignored: writes past it fail with EFBIG,
// as on a full disk.
Finished runWithFileLimit(const Args& argv, int kib) {
  Args shell = {"/bin/bash", "-c",
                "ulimit -f " + std::to_string(kib) + "; trap '' XFSZ; exec \"$@\"", "limited"};
  shell.insert(shell.end(), argv.begin(), argv.end());
  return run(shell, {}, 60s);
}

}  // namespace

// Refused before finetune saved checkpoints; honoured since: the launch's folder instead of OUT,
// its limit where --save_total_limit is not given, its asynchronous saves.
TEST_CASE("finetune honours the launcher's checkpoint folder, limit and asynchronous saves",
          "[finetune][integration]") {
  TempDir dir;
  const std::string model = fixture(dir, "model", {});
  const std::string text = writeText(dir, 150);
  const std::string checkpoints = dir.path() + "/ck";
  Args ft = finetuneArgs(model, text, 3, dir.path() + "/out");
  ft.insert(ft.end(), {"--save_steps", "1"});
  const Finished limited = run(ft,
                               {{"CXXLAUNCH_CHECKPOINT_DIR", checkpoints},
                                {"CXXLAUNCH_CHECKPOINT_TOTAL_LIMIT", "2"},
                                {"CXXLAUNCH_CHECKPOINT_ASYNC", "true"}},
                               60s);
  INFO(limited.out << limited.err);
  REQUIRE(limited.exit_code == 0);
  for (int step = 1; step <= 3; ++step) {
    CHECK_THAT(limited.out,
               Catch::Contains("saved " + checkpoints + "/checkpoint-" + std::to_string(step)));
  }
  CHECK_FALSE(fs::exists(checkpoints + "/checkpoint-1"));
  CHECK(fs::exists(checkpoints + "/checkpoint-2/manifest"));
  CHECK(fs::exists(checkpoints + "/checkpoint-3/manifest"));
  CHECK(fs::exists(dir.path() + "/out/config.json"));
  CHECK_FALSE(fs::exists(dir.path() + "/out/checkpoint-3"));

  // Through the launcher itself; --save_total_limit wins over its limit.
  const std::string launched_dir = dir.path() + "/ck2";
  Args argv = {CXXLAUNCH_BIN,      "run",        "--nproc_per_node",         "1",
               "--checkpoint_dir", launched_dir, "--checkpoint_total_limit", "1"};
  ft = finetuneArgs(model, text, 3, dir.path() + "/out2");
  ft.insert(ft.end(), {"--save_steps", "1", "--save_total_limit", "3"});
  argv.insert(argv.end(), ft.begin(), ft.end());
  const Finished launched = run(argv, {}, 60s);
  INFO(launched.out << launched.err);
  REQUIRE(launched.exit_code == 0);
  for (int step = 1; step <= 3; ++step) {
    CHECK(fs::exists(launched_dir + "/checkpoint-" + std::to_string(step) + "/manifest"));
  }
}

TEST_CASE("A FIFO where finetune or llama_init expects a file is refused at once",
          "[finetune][integration]") {
  TempDir dir;
  const std::string model = fixture(dir, "model", {});
  const std::string text = writeText(dir, 150);
  const std::string out = dir.path() + "/out";
  for (const char* name : {"config.json", "tokenizer.model", "tokenizer.json"}) {
    INFO(name);
    const std::string copy = copyModel(dir, model, std::string("fifo-") + name);
    makeFifo(copy + "/" + name);
    // Hung forever before; tokenizer.json only at the export, after training.
    requireRefused(run(finetuneArgs(copy, text, 2, out), {}, 30s), "not a regular file");
    CHECK_FALSE(fs::exists(out + ".partial"));
  }
  const std::string fifo = dir.path() + "/fifo";
  makeFifo(fifo);
  requireRefused(run(finetuneArgs(model, fifo, 2, out), {}, 30s),
                 "--data '" + fifo + "': is not a regular file");
  requireRefused(run({LLAMA_INIT_BIN, "--output_dir", out, "--config", fifo}, {}, 30s),
                 "config '" + fifo + "': is not a regular file");
  // Under the launcher with ZeRO-3, every rank refuses.
  const std::string copy = copyModel(dir, model, "fifo-zero3");
  makeFifo(copy + "/config.json");
  const std::string zero3 = writeConfig(dir, "zero3",
                                        "distributed_type: DEEPSPEED\ndeepspeed_config:\n"
                                        "  zero_stage: 3\n  zero3_init_flag: true\n");
  const Finished launched = launch(zero3, finetuneArgs(copy, text, 2, out));
  INFO(launched.out << launched.err);
  CHECK(launched.exit_code == 2);
  CHECK_THAT(launched.out + launched.err, Catch::Contains("not a regular file"));
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("finetune checks --output_dir before any work: a trailing slash is the same folder",
          "[finetune][integration]") {
  TempDir dir;
  const std::string model = fixture(dir, "model", {});
  const std::string text = writeText(dir, 150);
  fs::create_directories(dir.path() + "/ft/o");
  // OUT/ names OUT: trained, renamed into place, nothing hidden left inside.
  const Finished trained = run(finetuneArgs(model, text, 1, dir.path() + "/ft/o/trail/"), {}, 60s);
  INFO(trained.out << trained.err);
  REQUIRE(trained.exit_code == 0);
  CHECK(fs::exists(dir.path() + "/ft/o/trail/config.json"));
  CHECK_FALSE(fs::exists(dir.path() + "/ft/o/trail/.partial"));
  CHECK_FALSE(fs::exists(dir.path() + "/ft/o/trail.partial"));

  // What cannot take the result is refused before training, for finetune and llama_init alike.
  const std::string file = dir.path() + "/empty-file";
  std::ofstream{file};
  const std::string empty = dir.path() + "/empty-folder", link = dir.path() + "/link";
  fs::create_directory(empty);
  fs::create_directory_symlink(empty, link);
  for (const auto& [out, said] :
       std::vector<std::pair<std::string, std::string>>{{file, "exists and is not a folder"},
                                                        {link, "is a symbolic link"},
                                                        {link + "/", "is a symbolic link"},
                                                        {".", "names no folder of its own"},
                                                        {"..", "names no folder of its own"},
                                                        {file + "/sub", "Not a directory"}}) {
    INFO(out);
    requireRefused(run(finetuneArgs(model, text, 2, out)), said);
    Args init = {LLAMA_INIT_BIN, "--output_dir", out};
    init.insert(init.end(), kTiny.begin(), kTiny.end());
    requireRefused(run(init), said);
  }
  CHECK(fs::is_empty(empty));
  CHECK(fs::file_size(file) == 0);
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    CHECK_FALSE(entry.path().string().ends_with(".partial"));
  }
  // --steps 0 writes nothing, so an --output_dir with it is a mistake, not silently dropped.
  requireRefused(run(finetuneArgs(model, text, 0, dir.path() + "/unused")), "drop --output_dir");
}

TEST_CASE("Absurd or mistyped configs and flags are one error line before anything is allocated",
          "[finetune][integration]") {
  TempDir dir;
  const std::string model = fixture(dir, "model", {});
  const std::string text = writeText(dir, 150);
  const std::string out = dir.path() + "/out";
  const auto config = nlohmann::json::parse(readFile(model + "/config.json"));
  auto withConfig = [&](const std::string& name, const std::string& key, const nlohmann::json& v) {
    const std::string copy = copyModel(dir, model, name);
    auto changed = config;
    changed[key] = v;
    std::ofstream(copy + "/config.json", std::ios::trunc) << changed.dump();
    return copy;
  };
  const auto started = std::chrono::steady_clock::now();
  requireRefused(run(finetuneArgs(withConfig("type", "model_type", 7), text, 2, out)),
                 "model_type is 7, not a name");
  // Sizes the safetensors files do not hold: refused before the model is built (a trillion
  // embedding rows, a hundred million layers).
  requireRefused(run(finetuneArgs(withConfig("vocab", "vocab_size", 1000000000000), text, 2, out)),
                 "does not fit the weights");
  requireRefused(
      run(finetuneArgs(withConfig("layers", "num_hidden_layers", 100000000), text, 2, out)),
      "does not fit the weights");
  // llama_init has no weights to hold against: the machine's memory bounds it.
  Args huge = {LLAMA_INIT_BIN, "--output_dir", out};
  huge.insert(huge.end(), kTiny.begin(), kTiny.end());
  huge.insert(huge.end(), {"--num_hidden_layers", "100000000"});
  requireRefused(run(huge), "more than this machine's");
  CHECK(std::chrono::steady_clock::now() - started < 30s);

  const std::string loop = dir.path() + "/loop";
  fs::create_symlink(loop, loop);
  requireRefused(run(finetuneArgs(loop, text, 2, out)), "Too many levels of symbolic links");

  // A config of 17 MiB (valid JSON, padded with spaces) is not read, nor copied into OUT.
  const std::string padded = copyModel(dir, model, "padded");
  std::ofstream(padded + "/config.json", std::ios::trunc)
      << config.dump() << std::string(size_t{17} << 20, ' ');
  requireRefused(run(finetuneArgs(padded, text, 2, out)), "more than the 16777216");
  const std::string folder = copyModel(dir, model, "folder");
  fs::remove(folder + "/config.json");
  fs::create_directory(folder + "/config.json");
  requireRefused(run(finetuneArgs(folder, text, 2, out)), "is a directory");
  requireRefused(run(finetuneArgs(model, dir.path(), 2, out)),
                 "--data '" + dir.path() + "': is a directory");
  for (const char* lr : {"inf", "nan", "-inf"}) {
    Args args = finetuneArgs(model, text, 2, out);
    args.insert(args.end(), {"--lr", lr});
    requireRefused(run(args), "a finite --learning_rate > 0");
  }
  // Trainer's flags out of their range: named, before training.
  for (const auto& [flags, said] : std::vector<std::pair<Args, std::string>>{
           {{"--lr_scheduler_type", "polynomial"},
            "--lr_scheduler_type 'polynomial' is not linear, cosine, constant or "
            "constant_with_warmup"},
           {{"--warmup_steps", "10", "--lr_scheduler_type", "linear"},
            "--warmup_steps 10 is more than the run's 2 optimizer steps"},
           {{"--adam_beta2", "1"}, "--adam_beta2 must be in [0, 1) (got 1)"},
           {{"--warmup_ratio", "1.5"}, "--warmup_ratio must be in [0, 1]"},
           {{"--max_steps", "0", "--resume_from_checkpoint", "latest"},
            "drop --resume_from_checkpoint"}}) {
    Args args = finetuneArgs(model, text, 2, flags[1] == "0" ? "" : out);
    args.insert(args.end(), flags.begin(), flags.end());
    requireRefused(run(args), said);
  }
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("A full disk leaves no OUT.partial behind, and llama_init writes under a partial name",
          "[finetune][integration]") {
  TempDir dir;
  const std::string model = fixture(dir, "model", {});
  const std::string text = writeText(dir, 150);
  // The fp32 export is about 450 KiB in one file; files may grow to 256 KiB.
  const std::string out = dir.path() + "/out";
  Args no_checkpoints = finetuneArgs(model, text, 1, out);
  no_checkpoints.insert(no_checkpoints.end(), {"--save_steps", "0"});  // the export alone
  const Finished full = runWithFileLimit(no_checkpoints, 256);
  INFO(full.out << full.err);
  CHECK(full.exit_code == 1);
  CHECK_THAT(full.err, Catch::Contains("error: ") && Catch::Contains("File too large"));
  CHECK_FALSE(fs::exists(out));
  CHECK_FALSE(fs::exists(out + ".partial"));

  Args init = {LLAMA_INIT_BIN, "--output_dir", out};
  init.insert(init.end(), kTiny.begin(), kTiny.end());
  const Finished full_init = runWithFileLimit(init, 256);
  INFO(full_init.out << full_init.err);
  CHECK(full_init.exit_code == 1);
  CHECK_FALSE(fs::exists(out));
  CHECK_FALSE(fs::exists(out + ".partial"));
  // Written whole, the folder appears under its name only at the end.
  const Finished written = run(init);
  REQUIRE(written.exit_code == 0);
  CHECK(fs::exists(out + "/config.json"));
  CHECK_FALSE(fs::exists(out + ".partial"));
}

TEST_CASE("finetune's loss line says what it averages, and --steps 0 only evaluates",
          "[finetune][integration]") {
  TempDir dir;
  const std::string model = fixture(dir, "model", {});
  const std::string text = writeText(dir, 400);
  const std::string project = dir.path() + "/runs";
  Args args = finetuneArgs(model, text, 4, dir.path() + "/out");
  args.insert(args.end(), {"--print_every", "2", "--run_name", "ft"});
  const Finished trained =
      run(args, {{"CXXLAUNCH_LOG_WITH", "jsonl"}, {"CXXLAUNCH_PROJECT_DIR", project}}, 60s);
  INFO(trained.out << trained.err);
  REQUIRE(trained.exit_code == 0);
  // The trackers keep each step's own loss; the console prints the mean of the window.
  std::map<int, double> per_step;
  std::istringstream lines(readFile(project + "/ft/metrics.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    const auto l = nlohmann::json::parse(line);
    if (l.contains("loss")) per_step[l["step"].get<int>()] = l["loss"].get<double>();
  }
  REQUIRE(per_step.size() == 4);
  const std::regex printed(
      R"(step +([0-9]+)/4  loss ([0-9.]+) \(mean of steps ([0-9]+)-([0-9]+)\))");
  int windows = 0;
  for (auto it = std::sregex_iterator(trained.out.begin(), trained.out.end(), printed);
       it != std::sregex_iterator(); ++it, ++windows) {
    const int step = std::stoi((*it)[1]), first = std::stoi((*it)[3]);
    CHECK(std::stoi((*it)[4]) == step);
    CHECK(first == step - 1);
    CHECK(std::stod((*it)[2]) == Approx((per_step[first] + per_step[step]) / 2).margin(1.5e-4));
  }
  CHECK(windows == 2);

  const Finished evaluated = run(finetuneArgs(model, text, 0, ""));
  INFO(evaluated.out << evaluated.err);
  REQUIRE(evaluated.exit_code == 0);
  CHECK_THAT(evaluated.out, !Catch::Contains("fine-tuning on") &&
                                !Catch::Contains("before training") &&
                                Catch::Contains("evaluating on 1 process(es)"));
  CHECK_THAT(evaluated.out, Catch::Contains("(" + model + "; fp32 compute)"));
}

TEST_CASE("Under bf16 the export read back is what --steps 0 reports under the same config",
          "[finetune][integration]") {
  TempDir dir;
  const std::string model = fixture(dir, "model", {});
  const std::string text = writeText(dir, 150);
  const std::string config = writeConfig(dir, "zero3-bf16",
                                         "mixed_precision: bf16\n"
                                         "distributed_type: DEEPSPEED\ndeepspeed_config:\n"
                                         "  zero_stage: 3\n  zero3_init_flag: true\n"
                                         "  zero3_save_16bit_model: true\n");
  const std::string out = dir.path() + "/out";
  const Finished trained = launch(config, finetuneArgs(model, text, 2, out));
  INFO(trained.out << trained.err);
  REQUIRE(trained.exit_code == 0);
  const std::vector<double> evals = evalLosses(trained.out);
  REQUIRE(evals.size() == 3);
  // Each figure names the precision it was computed in: the same weights in fp32 give another
  // fourth decimal (docs/finetune.md, "The eval figures").
  CHECK_THAT(trained.out, Catch::Contains("(" + out + " read back; bf16 compute)"));
  const Finished again = launch(config, finetuneArgs(out, text, 0, ""));
  INFO(again.out << again.err);
  REQUIRE(again.exit_code == 0);
  const std::vector<double> reread = evalLosses(again.out);
  REQUIRE(reread.size() == 1);
  CHECK(reread[0] == Approx(evals[2]).margin(1.5e-4));
  CHECK_THAT(again.out, Catch::Contains("(" + out + "; bf16 compute)"));
}
