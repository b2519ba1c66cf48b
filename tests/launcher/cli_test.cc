#include "launcher/cli.h"

#include <catch2/catch.hpp>

#include "common/command_line.h"

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
  for (const Args& args :
       {Args{"--nproc_per_node=3", "true"}, Args{"--nproc-per-node", "3", "true"},
        Args{"--nproc_per_node", "3", "true"}}) {
    auto o = parseRunArgs(args, host());
    REQUIRE(o.nproc_per_node == 3);
    REQUIRE(o.program.ends_with("/true"));
  }
}

TEST_CASE("torchrun's own spellings parse, dashed and under_scored, with = and without", "[cli]") {
  // As torchrun's documentation and scripts write them.
  auto o = parseRunArgs(
      {"--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=node0:29500",
       "--rdzv-id=job", "--max-restarts=3", "--monitor-interval=5", "--master-addr", "10.0.0.1",
       "--master-port", "29501", "--local-addr=10.0.0.2", "--log-dir=/tmp/l",
       "--local-ranks-filter=0", "--rdzv-conf=join_timeout=30", "--run-id", "job2", "/bin/true"},
      host());
  CHECK(o.nproc_per_node == 2);
  CHECK(o.rdzv.max_nodes == 2);
  CHECK(o.rdzv.backend == "c10d");
  CHECK(o.rdzv.endpoint == "node0:29500");
  CHECK(o.run_id == "job2");  // --rdzv-id and --run-id are one flag: the last one wins
  CHECK(o.max_restarts == 3);
  CHECK(o.monitor_interval.count() == 5000);
  CHECK(o.master_addr == "10.0.0.1");
  CHECK(o.master_port == 29501);
  CHECK(o.rdzv.local_addr == "10.0.0.2");
  CHECK(o.log_dir == "/tmp/l");
  CHECK(o.local_ranks_filter == std::set<int>{0});
  CHECK(o.rdzv.join_timeout.count() == 30000);
  auto u = parseRunArgs({"--nproc_per_node=2", "--max_restarts", "1", "--rdzv_endpoint", "node0",
                         "--rdzv_id=j", "--nnodes", "1:2", "/bin/true"},
                        host());
  CHECK(u.nproc_per_node == 2);
  CHECK(u.max_restarts == 1);
  CHECK(u.rdzv.endpoint == "node0:29400");
  CHECK(u.rdzv.min_nodes == 1);
  CHECK(u.rdzv.max_nodes == 2);
  // accelerate's flags too.
  CHECK(parseRunArgs({"--num-processes=3", "--cpu", "/bin/true"}, host()).nproc_per_node == 3);
  CHECK(parseRunArgs({"--num_processes", "4", "--cpu", "/bin/true"}, host()).nproc_per_node == 4);
  // The same flag twice: the last one wins, as with argparse.
  CHECK(parseRunArgs({"--nproc_per_node=2", "--nproc-per-node=5", "/bin/true"}, host())
            .nproc_per_node == 5);
  // A typo in either spelling is suggested in that spelling.
  REQUIRE_THROWS_WITH(parseRunArgs({"--nproc-per-nod=2", "/bin/true"}, host()),
                      Catch::Contains("did you mean --nproc-per-node?"));
  REQUIRE_THROWS_WITH(parseRunArgs({"--max_restart=2", "/bin/true"}, host()),
                      Catch::Contains("did you mean --max_restarts?"));
}

TEST_CASE("run --help comes from the flag table", "[cli]") {
  try {
    parseRunArgs({"--nproc_per_node=2", "--help"}, host());
    FAIL("no help");
  } catch (const cxxlaunch::cli::HelpRequested& help) {
    CHECK(help.text == runHelp());
    CHECK_THAT(help.text, Catch::Contains("--nproc_per_node N|cpu|gpu|auto"));
    CHECK_THAT(help.text, Catch::Contains("--rdzv_endpoint"));
    CHECK_THAT(help.text, !Catch::Contains("--nproc-per-node"));  // one spelling shown
  }
  // After the program, --help is the program's.
  CHECK(parseRunArgs({"/bin/true", "--help"}, host()).args == Args{"--help"});
}

TEST_CASE("Every torchrun flag is accepted", "[cli]") {
  auto o = parseRunArgs({"--standalone",
                         "--max-restarts=2",
                         "--monitor_interval",
                         "0.5",
                         "--role",
                         "trainer",
                         "--log-dir",
                         "/tmp/x",
                         "-r",
                         "3",
                         "--tee=0:1,1:2",
                         "--local_ranks_filter",
                         "0,1",
                         "--master_addr",
                         "10.1.1.1",
                         "--master-port=29501",
                         "--rdzv_id",
                         "job-1",
                         "--no_python",
                         "--shutdown_grace",
                         "2.5",
                         "--nproc_per_node",
                         "2",
                         "/bin/true"},
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
  auto o = parseRunArgs(
      {"--nproc_per_node=2", "/bin/echo", "--nproc_per_node=9", "${local_rank}", "--", "-x"},
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
      {{"--nproc_per_node", "65537", "true"}, "'65537' is not a number from 1 to 65536"},
      {{"--monitor_interval=0", "true"}, "a number of seconds > 0"},
      {{"--run_id", "../etc", "true"}, "letters, digits"},
      {{"--redirects", "4", "true"}, "0-3 or a per-local-rank map"},
      {{"--standalone=maybe", "true"}, "--standalone: 'maybe' is not true or false"},
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
  for (const char* flag :
       {"--nproc_per_node", "--gpus", "--standalone", "--max_restarts", "--monitor_interval",
        "--shutdown_grace", "--role", "--log_dir", "--redirects", "--tee", "--local_ranks_filter",
        "--master_addr", "--master_port", "--run_id", "--rdzv_id", "--no_python"}) {
    REQUIRE_THAT(help, Catch::Contains(flag));
  }
}

TEST_CASE("Multi-node flags parse", "[cli]") {
  auto o =
      parseRunArgs({"--nnodes=2:4", "--rdzv-endpoint", "node0", "--rdzv_id", "job", "--rdzv_conf",
                    "join_timeout=60,last_call_timeout=0,keep_alive_interval=0.5,"
                    "keep_alive_max_misses=4,close_timeout=9,is_host=false,tls_ca=ca.pem",
                    "--local_addr", "10.0.0.7", "true"},
                   host());
  CHECK(o.rdzv.min_nodes == 2);
  CHECK(o.rdzv.max_nodes == 4);
  CHECK(o.rdzv.endpoint == "node0:29400");
  CHECK(o.rdzv.join_timeout.count() == 60000);
  CHECK(o.rdzv.last_call_timeout.count() == 0);
  CHECK(o.rdzv.keep_alive_interval.count() == 500);
  CHECK(o.rdzv.keep_alive_max_misses == 4);
  CHECK(o.rdzv.close_timeout.count() == 9000);
  CHECK(o.rdzv.is_host == false);
  CHECK(o.rdzv.tls_ca == "ca.pem");
  CHECK(o.rdzv.local_addr == "10.0.0.7");
  CHECK(o.rdzv.multiNode());
  auto s = parseRunArgs({"--nnodes", "3", "--rdzv_backend=static", "--node_rank", "2",
                         "--rdzv_endpoint", "[::1]:5000", "--rdzv_id", "j", "true"},
                        host());
  CHECK(s.rdzv.endpoint == "[::1]:5000");
  CHECK(s.rdzv.node_rank == 2);
  // The etcd backend (torchrun's etcd-v2 name too): a list of members, etcd's auth and TLS in
  // --rdzv_conf (torchrun's cacert/cert/key spellings as well).
  auto e = parseRunArgs(
      {"--nnodes", "1:3", "--rdzv_backend", "etcd-v2", "--rdzv_endpoint", "e1:2379,e2,[::1]:23790",
       "--rdzv_id", "j", "--rdzv_conf",
       "user=root,password=pw,cacert=ca.pem,cert=c.pem,key=k.pem,protocol=https", "true"},
      host());
  CHECK(e.rdzv.backend == "etcd");
  CHECK(e.rdzv.etcd());
  CHECK(e.rdzv.etcd_endpoints == "e1:2379,e2,[::1]:23790");
  CHECK(e.rdzv.etcd_user == "root");
  CHECK(e.rdzv.etcd_password == "pw");
  CHECK(e.rdzv.tls_ca == "ca.pem");
  CHECK(e.rdzv.tls_cert == "c.pem");
  CHECK(e.rdzv.tls_key == "k.pem");
  CHECK(parseRunArgs({"--rdzv_backend", "etcd", "--rdzv_endpoint", "https://e1:2379", "--rdzv_id",
                      "j", "true"},
                     host())
            .rdzv.etcd_endpoints == "https://e1:2379");
  auto single = parseRunArgs({"true"}, host());
  CHECK_FALSE(single.rdzv.multiNode());
  CHECK(single.run_id.size() == 12);  // a random id
}

TEST_CASE("Bad multi-node command lines fail with one clear message", "[cli]") {
  struct Case {
    Args args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--nnodes", "3:2", "true"}, "MIN:MAX with 1 <= MIN <= MAX"},
      {{"--nnodes", "0", "true"}, "a number of nodes >= 1"},
      {{"--nnodes", "2", "--rdzv_id", "j", "true"}, "needs --rdzv_endpoint"},
      {{"--nnodes", "2", "--rdzv_endpoint", "h:1", "true"}, "needs --rdzv_id"},
      {{"--rdzv_endpoint", "h:70000", "--rdzv_id", "j", "true"}, "port 1-65535"},
      {{"--rdzv_conf", "join_timout=5", "true"}, "did you mean join_timeout?"},
      {{"--rdzv_conf", "keep_alive_interval=-1", "true"}, "a number of seconds > 0"},
      {{"--rdzv_conf", "last_call_timeout=-2", "true"}, "a number of seconds >= 0"},
      {{"--rdzv_conf", "token_file=/no/such/token", "true"}, "'/no/such/token': cannot open"},
      {{"--rdzv_conf", "token_file=/dev/zero", "true"}, "not a regular file"},
      {{"--rdzv_conf", "token_file=/", "true"}, "is a directory"},
      // Each within its own range, but not together.
      {{"--rdzv_conf", "keep_alive_interval=9223372036854775807", "true"}, "<= 86400"},
      {{"--rdzv_conf", "last_call_timeout=90000", "true"}, "<= 86400"},
      {{"--nnodes", "32769", "--nproc_per_node", "65536", "--rdzv_endpoint", "h", "--rdzv_id", "j",
        "true"},
       "= 2147549184 ranks, more than the 16777216"},
      {{"--rdzv_conf", "tls_cert=a.pem", "true"}, "tls_cert and tls_key go together"},
      {{"--rdzv_backend", "etcd3", "true"}, "c10d, static or etcd"},
      {{"--rdzv_backend", "etcd", "--rdzv_id", "j", "true"}, "the etcd members"},
      {{"--rdzv_backend", "etcd", "--rdzv_endpoint", "h", "true"}, "needs --rdzv_id"},
      {{"--rdzv_backend", "etcd", "--rdzv_endpoint", "h", "--rdzv_id", "j", "--rdzv_conf",
        "user=root", "true"},
       "user= needs password= or password_file="},
      {{"--rdzv_endpoint", "a:1,b:2", "--rdzv_id", "j", "true"},
       "a list of endpoints or a URL is for --rdzv_backend etcd"},
      {{"--rdzv_endpoint", "http://a:1", "--rdzv_id", "j", "true"},
       "a list of endpoints or a URL is for --rdzv_backend etcd"},
      {{"--rdzv_endpoint", "a:1,,b:2", "--rdzv_id", "j", "true"}, "HOST or HOST:PORT"},
      {{"--rdzv_conf", "usr=root", "true"}, "did you mean user?"},
      {{"--rdzv_backend", "etcd", "--rdzv_endpoint", "h", "--rdzv_id", "j", "--rdzv_conf",
        "etcd_prefix=jobs", "true"},
       "etcd_prefix 'jobs' is no key prefix: it must start with '/'"},
      {{"--rdzv_endpoint", "h:1", "--rdzv_id", "j", "--rdzv_conf", "etcd_prefix=/jobs", "true"},
       "etcd_prefix is for --rdzv_backend etcd"},
      {{"--rdzv_backend", "static", "--nnodes", "1:2", "--rdzv_endpoint", "h", "--rdzv_id", "j",
        "true"},
       "needs a fixed --nnodes"},
      {{"--rdzv_backend", "static", "--nnodes", "2", "--rdzv_endpoint", "h", "--rdzv_id", "j",
        "true"},
       "needs --node_rank"},
      {{"--rdzv_backend", "static", "--nnodes", "2", "--node_rank", "2", "--rdzv_endpoint", "h",
        "--rdzv_id", "j", "true"},
       "out of range for 2 nodes"},
      {{"--standalone", "--nnodes", "2", "true"}, "--standalone is a single-node job"},
  };
  for (const auto& c : cases) {
    INFO("args: " << Catch::StringMaker<Args>::convert(c.args));
    REQUIRE_THROWS_AS(parseRunArgs(c.args, host()), UsageError);
    REQUIRE_THROWS_WITH(parseRunArgs(c.args, host()), Catch::Contains(c.message));
  }
}

TEST_CASE("cxxlaunch status takes an endpoint and a run id", "[cli]") {
  auto s = parseStatusArgs({"--rdzv_endpoint", "h:1", "--rdzv-id=job"});
  CHECK(s.rdzv.endpoint == "h:1");
  CHECK(s.run_id == "job");
  REQUIRE_THROWS_WITH(parseStatusArgs({"--rdzv_id", "job"}),
                      Catch::Contains("needs --rdzv_endpoint"));
  REQUIRE_THROWS_WITH(parseStatusArgs({"--bogus", "x"}), Catch::Contains("unknown flag '--bogus'"));
  CHECK(s.silent_after == std::chrono::seconds(60));
  CHECK(parseStatusArgs({"--rdzv_endpoint", "h:1", "--rdzv_id", "job", "--silent-after", "2.5"})
            .silent_after == std::chrono::milliseconds(2500));
  REQUIRE_THROWS_AS(
      parseStatusArgs({"--rdzv_endpoint", "h:1", "--rdzv_id", "job", "--silent_after", "0"}),
      UsageError);
}
