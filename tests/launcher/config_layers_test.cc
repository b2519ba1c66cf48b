// Layering's part that is accelerate's semantics rather than precedence: a file's section of a
// distributed type not in use is ignored, as accelerate ignores it.

#include <catch2/catch.hpp>
#include <fstream>

#include "launcher/cli.h"
#include "launcher/config.h"
#include "launcher/wizard.h"
#include "support/subprocess.h"

using namespace cxxlaunch::launcher;
using cxxlaunch::testing::TempDir;

namespace {

// accelerate's tests/test_configs/validate_launch_cmd.yaml, unchanged: its DeepSpeed file does
// not exist, and accelerate never opens it under distributed_type NO.
constexpr char kValidateLaunchCmd[] =
    "compute_environment: LOCAL_MACHINE\n"
    "debug: true\n"
    "num_processes: 1\n"
    "distributed_type: 'NO'\n"
    "fsdp_config:\n"
    "  fsdp_sync_module_states: false\n"
    "deepspeed_config:\n"
    "  deepspeed_config_file: path/to/be/ignored\n";

HostInfo host() {
  HostInfo h;
  h.cpus = 4;
  h.path = "/usr/bin:/bin";
  return h;
}

}  // namespace

TEST_CASE("A file's section of a distributed type not in use is ignored, its DeepSpeed file too",
          "[config]") {
  TempDir dir;
  const std::string file = dir.path() + "/validate_launch_cmd.yaml";
  std::ofstream(file) << kValidateLaunchCmd;
  ConfigLayers layers;
  layers.file = file;
  const Config c = resolveConfig(layers);
  CHECK_FALSE(c.isSet("deepspeed_config.deepspeed_config_file"));
  CHECK_FALSE(c.isSet("fsdp_config.fsdp_sync_module_states"));
  // Kept for writing the file again.
  CHECK(c.ignored.at("deepspeed_config.deepspeed_config_file") == "path/to/be/ignored");
  CHECK(c.ignored.at("fsdp_config.fsdp_sync_module_states") == "false");
  const std::vector<std::string> notes = {
      file +
          ":8:26: deepspeed_config (deepspeed_config_file) is for distributed_type DEEPSPEED, "
          "and this config's is NO (" +
          file + ":4:19); ignored, as accelerate does",
      file +
          ":6:28: fsdp_config (fsdp_sync_module_states) is for distributed_type FSDP, and "
          "this config's is NO (" +
          file + ":4:19); ignored, as accelerate does"};
  CHECK(c.notes == notes);

  // `config --print` shows the notes; `run` takes the file.
  const std::string printed =
      runConfigCommand(parseConfigArgs({"--print", "--config_file", file}), host());
  for (const auto& note : notes) CHECK_THAT(printed, Catch::Contains("note: " + note + "\n"));
  const LaunchOptions o = parseRunArgs({"--config_file", file, "/bin/true"}, host());
  CHECK(o.nproc_per_node == 1);
  CHECK(o.worker_env.at("CXXLAUNCH_STRATEGY") == "ddp");

  // With DeepSpeed in use the same section counts: its file is read (and is missing).
  layers.flags = {{"distributed_type", "DEEPSPEED", "--use_deepspeed"}};
  CHECK_THROWS_WITH(resolveConfig(layers),
                    Catch::Contains("DeepSpeed config file 'path/to/be/ignored': cannot open it"));

  // From a flag it is the user's word for this run, but the JSON is still DeepSpeed's only.
  layers.file.clear();
  layers.flags = {{"deepspeed_config.deepspeed_config_file", "ds.json", "--deepspeed_config_file"}};
  CHECK(resolveConfig(layers).notes ==
        std::vector<std::string>{"--deepspeed_config_file: deepspeed_config_file is read for "
                                 "distributed_type DEEPSPEED only, and this config's is NO; not "
                                 "read"});
}
