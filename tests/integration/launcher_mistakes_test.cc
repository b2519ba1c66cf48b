// `cxxlaunch run` against the mistakes users make, with the real binary: a boolean flag followed
// by its value, more workers than cores, an argument that is not UTF-8, and the user guide named
// where it is, installed or in-tree.

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/subprocess.h"
#include "support/text_lines.h"

using namespace cxxlaunch::testing;
using Args = std::vector<std::string>;
namespace fs = std::filesystem;

namespace {}  // namespace

TEST_CASE("A boolean flag followed by true takes it as its value and not as the program",
          "[launcher][integration][bool_flags]") {
  TempDir dir;
  for (const std::string value : {"true", "false"}) {
    // Before the fix `true` was the program: /bin/true ran, printed nothing and exited 0.
    auto r = run({CXXLAUNCH_BIN, "run", "--log_dir", dir.path(), "--checkpoint_async", value,
                  "--debug", "/usr/bin/env"},
                 {{"XDG_CACHE_HOME", dir.path()}});
    INFO(r.err);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Contains("[rank 0]: CXXLAUNCH_CHECKPOINT_ASYNC=" + value + "\n"));
    CHECK_THAT(r.out, Catch::Contains("[rank 0]: CXXLAUNCH_DEBUG=true\n"));
    CHECK(r.err.empty());
  }
  auto eq = run(
      {CXXLAUNCH_BIN, "run", "--log_dir", dir.path(), "--checkpoint-async=false", "/usr/bin/env"});
  CHECK_THAT(eq.out, Catch::Contains("[rank 0]: CXXLAUNCH_CHECKPOINT_ASYNC=false\n"));
  auto bad = run({CXXLAUNCH_BIN, "run", "--checkpoint_async=maybe", "/usr/bin/env"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err ==
        "cxxlaunch run: error: --checkpoint_async: 'maybe' is not true or false (also yes/no, "
        "on/off, 1/0)\n");
  // The program `true` itself still runs, with a warning.
  auto program = run({CXXLAUNCH_BIN, "run", "--log_dir", dir.path(), "true"},
                     {{"XDG_CACHE_HOME", dir.path()}});
  CHECK(program.exit_code == 0);
  CHECK(program.err ==
        "cxxlaunch: warning: the program to launch is 'true', which does nothing but exit 0; if "
        "it was meant as a flag's value, write --FLAG=true before the program\n");
}

TEST_CASE("More workers than cores start, after one warning line", "[launcher][integration]") {
  TempDir dir;
  const std::string yaml = dir.path() + "/c.yaml";
  std::ofstream(yaml) << "distributed_type: FSDP\nnum_processes: 3\n";
  // One core for the launcher (its affinity), no GPU: 3 CPU workers oversubscribe it.
  const std::string warning =
      "cxxlaunch: warning: 3 worker processes on 1 CPU core(s) available to this launcher: the "
      "workers will share cores (oversubscribed), so each step runs slower than with 1 worker(s) "
      "or fewer; lower --nproc_per_node or num_processes";
  for (const Args& flags :
       {Args{"--num_processes", "3"}, Args{"--nproc_per_node", "3"}, Args{"--config_file", yaml}}) {
    Args argv = {"/usr/bin/taskset", "-c", "0", CXXLAUNCH_BIN, "run", "--log_dir", dir.path()};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {"/bin/sh", "-c", "echo ran"});
    auto r = run(argv, {{"CUDA_VISIBLE_DEVICES", ""}, {"XDG_CACHE_HOME", dir.path()}});
    INFO(Catch::StringMaker<Args>::convert(flags) << "\n" << r.err);
    CHECK(r.exit_code == 0);
    CHECK(lines(r.err) == std::vector<std::string>{warning});
    CHECK_THAT(r.out, Catch::Contains("[rank 2]: ran"));
  }
  auto within = run(
      {"/usr/bin/taskset", "-c", "0", CXXLAUNCH_BIN, "run", "--log_dir", dir.path(), "/bin/true"},
      {{"CUDA_VISIBLE_DEVICES", ""}, {"XDG_CACHE_HOME", dir.path()}});
  CHECK(within.exit_code == 0);
  CHECK(within.err.empty());
}

TEST_CASE("An argument that is not UTF-8 keeps the worker's exit code and run-summary.json",
          "[launcher][integration]") {
  TempDir logs;
  auto r = run({CXXLAUNCH_BIN, "run", "--log_dir", logs.path(), "--run_id", "bytes", "/bin/sh",
                "-c", "echo 'cut \xe2\x82' >&2; exit 3", "x\xff"});
  INFO(r.err);
  CHECK(r.exit_code == 3);  // was 1, with nlohmann's type_error.316
  CHECK_THAT(r.err, !Catch::Contains("json.exception"));
  const auto summary = nlohmann::json::parse(readFile(logs.path() + "/bytes/run-summary.json"));
  CHECK(summary["exit_code"] == 3);
  CHECK(summary["args"] ==
        nlohmann::json::array({"-c", "echo 'cut \\xe2\\x82' >&2; exit 3", "x\\xff"}));
  CHECK(summary["failures"][0]["stderr_tail"] == nlohmann::json::array({"cut \\xe2\\x82"}));
}

TEST_CASE("Messages name the user guide where it is, in-tree and installed",
          "[launcher][integration][doc_reference]") {
  TempDir dir;
  const std::string yaml = dir.path() + "/c.yaml";
  std::ofstream(yaml) << "num_proceses: 2\n";
  const std::string prefix = "(see the config guide: ";
  auto message = [&](const std::string& binary) {
    auto r = run({binary, "run", "--config_file", yaml, "/bin/true"});
    CHECK(r.exit_code == 2);
    const auto at = r.err.find(prefix);
    REQUIRE(at != std::string::npos);
    return r.err.substr(at + prefix.size(), r.err.size() - at - prefix.size() - 2);  // ")\n"
  };
  // In-tree: the source tree's page.
  const fs::path in_tree = message(CXXLAUNCH_BIN);
  CHECK(in_tree.filename() == "config.md");
  CHECK(fs::is_regular_file(in_tree));
  // Installed as cmake/install.cmake lays it out: the page beside the binary.
  const std::string installed = dir.path() + "/prefix";
  fs::create_directories(installed + "/bin");
  fs::create_directories(installed + "/share/doc/cxxlaunch");
  fs::copy_file(CXXLAUNCH_BIN, installed + "/bin/cxxlaunch");
  fs::copy_file(in_tree, installed + "/share/doc/cxxlaunch/config.md");
  CHECK(message(installed + "/bin/cxxlaunch") == installed + "/share/doc/cxxlaunch/config.md");
}
