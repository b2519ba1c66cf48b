// `cxxlaunch run`'s boolean flags: each takes no value (on), or true/false in every form the
// config's booleans take, and a word after a flag that is not a boolean is the program.

#include <catch2/catch.hpp>
#include <regex>

#include "launcher/cli.h"

using namespace cxxlaunch::launcher;
using Args = std::vector<std::string>;

namespace {

HostInfo host(int cpus = 8, int gpus = 0) {
  HostInfo h;
  h.cpus = cpus;
  h.gpus = gpus;
  h.path = "/usr/bin:/bin";
  return h;
}

// The boolean flags as --help lists them: every flag whose value is "[true|false]".
std::vector<std::string> booleanFlags() {
  const std::string help = runHelp();
  static const std::regex flag(R"(--([a-z0-9_]+)(?:, --[a-z0-9-]+)? \[true\|false\])");
  std::vector<std::string> flags;
  for (auto it = std::sregex_iterator(help.begin(), help.end(), flag); it != std::sregex_iterator();
       ++it) {
    flags.push_back((*it)[1]);
  }
  return flags;
}

}  // namespace

TEST_CASE("Every boolean flag takes no value or a separate value or =value and then the program",
          "[cli][bool_flags]") {
  const auto flags = booleanFlags();
  for (const char* name : {"cpu", "use_cpu", "debug", "checkpoint_async", "zero3_init_flag",
                           "zero3_save_16bit_model", "same_network", "fsdp_offload_params",
                           "use_cluster_env", "standalone", "multi_gpu", "use_fsdp"}) {
    CHECK(std::find(flags.begin(), flags.end(), name) != flags.end());
  }
  for (const auto& name : flags) {
    const std::string flag = "--" + name;
    for (const Args& before :
         {Args{flag}, Args{flag, "true"}, Args{flag, "false"}, Args{flag + "=false"},
          Args{flag + "=true"}, Args{flag, "yes"}, Args{flag, "no"}, Args{flag, "1"},
          Args{flag, "0"}, Args{flag, "False"}}) {
      Args args = before;
      args.insert(args.end(), {"/bin/echo", "hi", "--debug", "true"});
      INFO(Catch::StringMaker<Args>::convert(args));
      const LaunchOptions o = parseRunArgs(args, host());
      CHECK(o.program == "/bin/echo");
      CHECK(o.args == Args{"hi", "--debug", "true"});  // after the program: the program's
    }
  }
}

TEST_CASE("A boolean flag's value reaches what the flag sets", "[cli][bool_flags]") {
  auto env = [](const Args& args, const std::string& name) {
    Args all = args;
    all.push_back("/bin/echo");
    return parseRunArgs(all, host()).worker_env.at(name);
  };
  // The issue's case: `true` is the flag's value, ./train (here /bin/echo) the program.
  CHECK(env({"--checkpoint_async", "true"}, "CXXLAUNCH_CHECKPOINT_ASYNC") == "true");
  CHECK(env({"--checkpoint_async"}, "CXXLAUNCH_CHECKPOINT_ASYNC") == "true");
  CHECK(env({"--checkpoint-async", "false"}, "CXXLAUNCH_CHECKPOINT_ASYNC") == "false");
  CHECK(env({"--checkpoint_async=no"}, "CXXLAUNCH_CHECKPOINT_ASYNC") == "false");
  CHECK(env({"--debug", "0"}, "CXXLAUNCH_DEBUG") == "false");
  CHECK(env({"--debug", "on"}, "CXXLAUNCH_DEBUG") == "true");
  CHECK(env({"--zero3_init_flag"}, "CXXLAUNCH_ZERO3_INIT_FLAG") == "true");
  CHECK(env({"--zero3_init_flag", "false"}, "CXXLAUNCH_ZERO3_INIT_FLAG") == "false");
  CHECK(env({"--zero3_init_flag=true"}, "CXXLAUNCH_ZERO3_INIT_FLAG") == "true");
  CHECK(env({"--cpu"}, "CXXLAUNCH_BACKEND") == "gloo");
  CHECK(env({"--cpu", "false"}, "CXXLAUNCH_BACKEND") == "auto");
  CHECK(env({"--use_cpu=false", "--use_cpu"}, "CXXLAUNCH_BACKEND") == "gloo");  // the last wins
  CHECK(env({"--use_fsdp", "false"}, "CXXLAUNCH_STRATEGY") == "ddp");           // off: not FSDP
  CHECK(env({"--use_fsdp", "true"}, "CXXLAUNCH_STRATEGY") == "fsdp_full_shard");
  CHECK(parseRunArgs({"--standalone", "/bin/echo"}, host()).standalone);
  CHECK_FALSE(parseRunArgs({"--standalone", "false", "/bin/echo"}, host()).standalone);
  // A word that is no boolean after a switch is the program; flags with values keep theirs.
  const LaunchOptions o = parseRunArgs(
      {"--debug", "--role", "true", "-r", "3", "--checkpoint_async", "echo", "false"}, host());
  CHECK(o.program.ends_with("/echo"));
  CHECK(o.args == Args{"false"});
  CHECK(o.role == "true");
  CHECK(o.worker_env.at("CXXLAUNCH_DEBUG") == "true");
  CHECK(o.worker_env.at("CXXLAUNCH_CHECKPOINT_ASYNC") == "true");
  CHECK(parseRunArgs({"--", "true"}, host()).program.ends_with("/true"));
}

TEST_CASE("A boolean flag's bad value is a usage error naming the words it takes",
          "[cli][bool_flags]") {
  CHECK_THROWS_AS(parseRunArgs({"--debug=maybe", "/bin/echo"}, host()), UsageError);
  CHECK_THROWS_WITH(parseRunArgs({"--checkpoint_async=maybe", "/bin/echo"}, host()),
                    "--checkpoint_async: 'maybe' is not true or false (also yes/no, on/off, 1/0)");
  CHECK_THROWS_WITH(parseRunArgs({"--zero3-init-flag=", "/bin/echo"}, host()),
                    "--zero3_init_flag: '' is not true or false (also yes/no, on/off, 1/0)");
  // `--debug true` with nothing after: the value is taken, and there is no program.
  CHECK_THROWS_WITH(parseRunArgs({"--debug", "true"}, host()), Catch::Contains("no program given"));
}

TEST_CASE("A program named true or false is launched, with a warning", "[cli][bool_flags]") {
  for (const std::string program : {"true", "false"}) {
    const LaunchOptions o = parseRunArgs({"--nproc_per_node", "1", program}, host());
    CHECK(o.program.ends_with("/" + program));
    REQUIRE(o.warnings.size() == 1);
    CHECK_THAT(o.warnings[0], Catch::StartsWith("the program to launch is '" + program +
                                                "', which does nothing but exit"));
    CHECK_THAT(o.warnings[0], Catch::Contains("--FLAG=" + program + " before the program"));
  }
  CHECK(parseRunArgs({"/bin/echo", "true"}, host()).warnings.empty());
}
