#include <catch2/catch.hpp>

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
}  // namespace

TEST_CASE("Both spellings and both value forms of a flag parse", "[cli]") {
  for (const Args& args : {Args{"--nproc_per_node=3", "true"}, Args{"--nproc-per-node", "3", "true"},
                           Args{"--nproc_per_node", "3", "true"}}) {
    auto o = parseRunArgs(args, host());
    REQUIRE(o.nproc_per_node == 3);
    REQUIRE(o.program.ends_with("/true"));
  }
}

TEST_CASE("Every torchrun flag is accepted", "[cli]") {
  auto o = parseRunArgs({"--standalone", "--max-restarts=2", "--monitor_interval", "0.5", "--role",
                         "trainer", "--log-dir", "/tmp/x", "-r", "3", "--tee=0:1,1:2",
                         "--local_ranks_filter", "0,1", "--master_addr", "10.1.1.1",
                         "--master-port=29501", "--rdzv_id", "job-1", "--no_python",
                         "--shutdown_grace", "2.5", "--nproc_per_node", "2", "/bin/true"},
                        host());
  REQUIRE(o.standalone);
  REQUIRE(o.max_restarts == 2);
  REQUIRE(o.monitor_interval.count() == 500);
  REQUIRE(o.role == "trainer");
  REQUIRE(o.log_dir == "/tmp/x");
  REQUIRE(o.redirects.all == 3);
  REQUIRE(o.tee.forRank(0) == 1);
  REQUIRE(o.tee.forRank(1) == 2);
  REQUIRE(o.tee.forRank(2) == 0);
  REQUIRE(o.local_ranks_filter == std::set<int>{0, 1});
  REQUIRE(o.master_addr == "10.1.1.1");
  REQUIRE(o.master_port == 29501);
  REQUIRE(o.run_id == "job-1");
  REQUIRE(o.shutdown_grace.count() == 2500);
}

TEST_CASE("Everything after the program goes to it verbatim", "[cli]") {
  auto o = parseRunArgs({"--nproc_per_node=2", "/bin/echo", "--nproc_per_node=9", "${local_rank}",
                         "--", "-x"},
                        host());
  REQUIRE(o.nproc_per_node == 2);
  REQUIRE(o.program == "/bin/echo");
  REQUIRE(o.args == Args{"--nproc_per_node=9", "${local_rank}", "--", "-x"});
  auto dashed = parseRunArgs({"--", "/bin/echo", "--help"}, host());
  REQUIRE(dashed.args == Args{"--help"});
}

TEST_CASE("nproc_per_node cpu, gpu, auto and --gpus", "[cli]") {
  REQUIRE(parseRunArgs({"--nproc_per_node=cpu", "true"}, host(6)).nproc_per_node == 6);
  REQUIRE(parseRunArgs({"--nproc_per_node=auto", "true"}, host(6, 0)).nproc_per_node == 6);
  REQUIRE(parseRunArgs({"--nproc_per_node=auto", "true"}, host(6, 4)).nproc_per_node == 4);
  REQUIRE(parseRunArgs({"--nproc_per_node=gpu", "true"}, host(6, 2)).nproc_per_node == 2);
  REQUIRE_THROWS_WITH(parseRunArgs({"--nproc_per_node=gpu", "true"}, host(6, 0)),
                      Catch::Contains("no GPU found"));
  auto o = parseRunArgs({"--gpus", "0,2", "true"}, host(6, 4));
  REQUIRE(o.nproc_per_node == 2);
  REQUIRE(o.gpus == std::vector<int>{0, 2});
  REQUIRE_THROWS_WITH(parseRunArgs({"--gpus", "0,2", "--nproc_per_node=3", "true"}, host()),
                      Catch::Contains("one GPU id per worker"));
}

TEST_CASE("Bad command lines fail with one clear message", "[cli]") {
  struct Case {
    Args args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--nproc_per_node", "0", "true"}, "--nproc_per_node: '0' is not a number >= 1"},
      {{"--nproc_per_node", "two", "true"}, "'two' is not a number >= 1, cpu, gpu or auto"},
      {{"--nproc_per_nod=2", "true"}, "did you mean --nproc_per_node?"},
      {{"--bogus", "true"}, "unknown flag '--bogus'"},
      {{"--nproc_per_node=2"}, "no program given"},
      {{}, "no program given"},
      {{"--master_port", "65536", "true"}, "is not a port number 0-65535"},
      {{"--master_port", "-1", "true"}, "is not a port number"},
      {{"--max_restarts=-1", "true"}, "'-1' is not a number >= 0"},
      {{"--monitor_interval=0", "true"}, "a number of seconds > 0"},
      {{"--run_id", "../etc", "true"}, "letters, digits"},
      {{"--redirects", "4", "true"}, "0-3 or a per-local-rank map"},
      {{"--standalone=1", "true"}, "--standalone takes no value"},
      {{"--role"}, "--role needs a value"},
      {{"no-such-program-here"}, "'no-such-program-here' was not found on PATH"},
      {{"/etc/passwd"}, "is not an executable file"},
      {{"/no/such/file"}, "does not exist"},
      {{"train.py"}, "cxxlaunch run python3 train.py"},
  };
  for (const auto& c : cases) {
    INFO("args: " << Catch::StringMaker<Args>::convert(c.args));
    REQUIRE_THROWS_AS(parseRunArgs(c.args, host()), UsageError);
    REQUIRE_THROWS_WITH(parseRunArgs(c.args, host()), Catch::Contains(c.message));
  }
}

TEST_CASE("Console selection follows redirects, tee and the rank filter", "[cli]") {
  auto o = parseRunArgs({"--redirects=3", "--tee=0:1", "true"}, host());
  REQUIRE(o.onConsole(0, StreamSpec::kOut));
  REQUIRE_FALSE(o.onConsole(0, StreamSpec::kErr));
  REQUIRE_FALSE(o.onConsole(1, StreamSpec::kOut));
  auto f = parseRunArgs({"--local_ranks_filter=1", "true"}, host());
  REQUIRE_FALSE(f.onConsole(0, StreamSpec::kOut));
  REQUIRE(f.onConsole(1, StreamSpec::kErr));
}

TEST_CASE("Help lists every flag", "[cli]") {
  const std::string help = runHelp();
  for (const char* flag : {"--nproc_per_node", "--gpus", "--standalone", "--max_restarts",
                           "--monitor_interval", "--shutdown_grace", "--role", "--log_dir",
                           "--redirects", "--tee", "--local_ranks_filter", "--master_addr",
                           "--master_port", "--run_id", "--rdzv_id", "--no_python"}) {
    REQUIRE_THAT(help, Catch::Contains(flag));
  }
}
