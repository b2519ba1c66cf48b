// Multi-node jobs on loopback: several real `cxxlaunch run` processes (each a node with its own
// identity) meeting through an embedded rendezvous server or a real cxxlaunchd.

#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "support/daemon.h"
#include "support/foreign_listener.h"
#include "support/subprocess.h"
#include "support/worker_lines.h"

using namespace cxxlaunch::testing;
using namespace std::chrono_literals;
using Args = std::vector<std::string>;
namespace fs = std::filesystem;

namespace {

// Fast timeouts for tests: keep-alives every 300 ms, eviction after 2.1 s (a busy CI machine
// must not evict a live node).
const std::string kFastConf =
    "keep_alive_interval=0.3,keep_alive_max_misses=7,last_call_timeout=1,join_timeout=60";

Args node(const std::string& endpoint, const std::string& run_id, const Args& flags,
          const Args& steps, const std::string& conf = kFastConf) {
  Args argv = {CXXLAUNCH_BIN, "run",  "--rdzv_endpoint", endpoint,
               "--rdzv_id",   run_id, "--rdzv_conf",     conf};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(TEST_WORKER);
  argv.insert(argv.end(), steps.begin(), steps.end());
  return argv;
}

// Starts `count` nodes on a fresh loopback endpoint, node 0 told to host (`argv_of(endpoint, n)`
// puts hostConf(n) into its --rdzv_conf), and waits for each up to `limit`. When node 0 could not
// listen (a port someone else took between freePort() and its bind) it tries another port, up to
// three times: left to choose, every node would knock at a stranger's server until the join
// timeout. A node that did not finish in time is nullopt.
std::string hostConf(int n) { return n == 0 ? "is_host=1" : "is_host=0"; }
std::vector<std::optional<Finished>> runNodes(
    int count, const std::function<Args(const std::string& endpoint, int n)>& argv_of,
    std::chrono::milliseconds limit) {
  std::vector<std::optional<Finished>> results;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const std::string endpoint = "127.0.0.1:" + std::to_string(freePort());
    std::vector<std::unique_ptr<Subprocess>> nodes;
    for (int n = 0; n < count; ++n)
      nodes.push_back(std::make_unique<Subprocess>(argv_of(endpoint, n)));
    results.clear();
    for (auto& node : nodes) results.push_back(node->wait(limit));
    const auto& host = results.front();
    if (!(host && host->exit_code != 0 && host->err.find("cannot listen") != std::string::npos)) {
      break;
    }
  }
  return results;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("Two and three launchers form one world", "[multinode][integration]") {
  for (int nodes : {2, 3}) {
    const std::string run = "world" + std::to_string(nodes);
    const int world = 2 + (nodes - 1);  // nodes may differ in size: 2 workers on node 0, else 1
    const auto results = runNodes(
        nodes,
        [&](const std::string& endpoint, int n) {
          return node(endpoint, run,
                      {"--nnodes", std::to_string(nodes), "--nproc_per_node", n == 0 ? "2" : "1"},
                      {"env"}, kFastConf + "," + hostConf(n));
        },
        60s);
    std::multiset<std::string> ranks, node_ranks;
    for (const auto& r : results) {
      REQUIRE(r);
      INFO(r->out << r->err);
      REQUIRE(r->exit_code == 0);
      for (const auto& v : values(r->out, "RANK")) ranks.insert(v);
      for (const auto& v : values(r->out, "WORLD_SIZE")) CHECK(v == std::to_string(world));
      for (const auto& v : values(r->out, "GROUP_WORLD_SIZE")) CHECK(v == std::to_string(nodes));
      auto groups = values(r->out, "GROUP_RANK");
      REQUIRE_FALSE(groups.empty());
      node_ranks.insert(groups.front());
      CHECK(values(r->out, "MASTER_PORT").size() == values(r->out, "RANK").size());
    }
    std::multiset<std::string> expected, expected_nodes;
    for (int r = 0; r < world; ++r) expected.insert(std::to_string(r));
    for (int n = 0; n < nodes; ++n) expected_nodes.insert(std::to_string(n));
    CHECK(ranks == expected);
    CHECK(node_ranks == expected_nodes);
  }
}

// The launcher links gRPC statically with only the plugins it uses (apps/cxxlaunch/
// grpc_plugins.cc): TLS both ways, the hosting launcher's server and the other's client, must be
// among them.
TEST_CASE("Two launchers form one world over mutual TLS", "[multinode][integration][security]") {
  TempDir dir;
  const std::string d = dir.path();
  const std::string script =
      "set -e; cd " + d +
      "; ec='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes';"
      "openssl req -x509 $ec -days 1 -subj /CN=test-ca -keyout ca.key -out ca.crt 2>/dev/null;"
      "openssl req $ec -subj /CN=node -keyout node.key -out node.csr 2>/dev/null;"
      "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1' > node.ext;"
      "openssl x509 -req -in node.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 "
      "-extfile node.ext -out node.crt 2>/dev/null";
  REQUIRE(run({"/bin/sh", "-c", script}).exit_code == 0);
  const std::string files =
      "tls_ca=" + d + "/ca.crt,tls_cert=" + d + "/node.crt,tls_key=" + d + "/node.key";
  // The host is told to host (is_host=1), so that a port someone else took between freePort()
  // and its bind (other tests, other test runs on the machine) fails it at once instead of
  // leaving both nodes knocking at a stranger's plaintext server: then a fresh port is tried.
  std::multiset<std::string> ranks;
  for (int attempt = 0; attempt < 3 && ranks.empty(); ++attempt) {
    const std::string endpoint = "127.0.0.1:" + std::to_string(freePort());
    Subprocess host(
        node(endpoint, "tls", {"--nnodes", "2", "--rdzv_conf", files + ",is_host=1"}, {"env"}));
    Subprocess other(
        node(endpoint, "tls", {"--nnodes", "2", "--rdzv_conf", files + ",is_host=0"}, {"env"}));
    auto hosted = host.wait(60s);
    INFO(host.out() << host.err());
    REQUIRE(hosted);
    if (hosted->exit_code != 0 && hosted->err.find("cannot listen") != std::string::npos) continue;
    REQUIRE(hosted->exit_code == 0);
    auto joined = other.wait(60s);
    INFO(other.out() << other.err());
    REQUIRE(joined);
    REQUIRE(joined->exit_code == 0);
    for (const auto* r : {&*hosted, &*joined}) {
      for (const auto& v : values(r->out, "RANK")) ranks.insert(v);
    }
  }
  CHECK(ranks == std::multiset<std::string>{"0", "1"});
}

TEST_CASE("The static backend orders nodes by --node_rank", "[multinode][integration]") {
  const auto results = runNodes(
      2,
      [&](const std::string& endpoint, int n) {
        return node(endpoint, "static",
                    {"--rdzv_backend", "static", "--nnodes", "2", "--node_rank", std::to_string(n)},
                    {"env"}, kFastConf + "," + hostConf(n));
      },
      60s);
  const auto& a = results[0];
  const auto& b = results[1];
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(a->exit_code == 0);
  REQUIRE(b->exit_code == 0);
  CHECK(values(a->out, "GROUP_RANK") == std::vector<std::string>{"0"});
  CHECK(values(b->out, "GROUP_RANK") == std::vector<std::string>{"1"});
  CHECK(values(b->out, "RANK") == std::vector<std::string>{"1"});
}

TEST_CASE("A worker failure on one node restarts every node until the global count runs out",
          "[multinode][integration]") {
  Daemon daemon;
  // Rank 3 (the second node's second worker) always fails; one restart is allowed job-wide.
  const Args steps = {"env", "rank", "3", "exit", "3", "rank", "all", "sleep", "30"};
  const Args flags = {"--nnodes", "2", "--nproc_per_node", "2", "--max_restarts", "1"};
  Subprocess a(node(daemon.endpoint, "restarts", flags, steps));
  Subprocess b(node(daemon.endpoint, "restarts", flags, steps));
  auto ra = a.wait(60s), rb = b.wait(60s);
  REQUIRE(ra);
  REQUIRE(rb);
  INFO(ra->out << ra->err << rb->out << rb->err);
  CHECK(ra->exit_code == 3);
  CHECK(rb->exit_code == 3);
  for (const auto* r : {&*ra, &*rb}) {
    auto counts = values(r->out, "TORCHELASTIC_RESTART_COUNT");
    CHECK(std::set<std::string>(counts.begin(), counts.end()) ==
          std::set<std::string>{"0", "1"});  // both nodes restarted once, and only once
  }
  CHECK_THAT(ra->err + rb->err, Catch::Contains("root cause (*): rank 3 exit 3"));
  CHECK_THAT(ra->err + rb->err, Catch::Contains("the job failed: rank 3 exit 3 on node"));
}

TEST_CASE("Elastic: a killed node is evicted, survivors shrink, a newcomer is admitted",
          "[multinode][integration]") {
  Daemon daemon;
  TempDir dir;
  const std::string done = dir.path() + "/done";
  const Args flags = {"--nnodes", "2:3", "--nproc_per_node", "1"};
  const Args steps = {"env", "pidfile", dir.path(), "wait-file", done};
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int n = 0; n < 3; ++n) {
    nodes.push_back(std::make_unique<Subprocess>(node(daemon.endpoint, "elastic", flags, steps)));
  }
  auto sizes = [&](Subprocess& p) { return values(p.out(), "GROUP_WORLD_SIZE"); };
  REQUIRE(eventually(
      [&] {
        for (auto& n : nodes) {
          if (sizes(*n) != std::vector<std::string>{"3"}) return false;
        }
        return true;
      },
      30s));

  auto status =
      run({CXXLAUNCH_BIN, "status", "--rdzv_endpoint", daemon.endpoint, "--rdzv_id", "elastic"});
  CHECK(status.exit_code == 0);
  CHECK_THAT(status.out, Catch::Contains("running"));
  CHECK(count(status.out, "127.0.0.1_") == 3);

  // SIGKILL the third node's agent: its worker dies with it.
  const std::string victim_rank = values(nodes[2]->out(), "RANK").at(0);
  REQUIRE(eventually([&] { return fs::exists(dir.path() + "/rank" + victim_rank + ".pid"); }, 10s));
  const pid_t victim_worker = std::stoi(readFile(dir.path() + "/rank" + victim_rank + ".pid"));
  ::kill(nodes[2]->pid(), SIGKILL);
  REQUIRE(nodes[2]->wait(5s));
  CHECK(eventually([&] { return !alive(victim_worker); }, 2s));

  // The survivors evict it and restart as a world of two.
  REQUIRE(eventually(
      [&] {
        return sizes(*nodes[0]) == std::vector<std::string>{"3", "2"} &&
               sizes(*nodes[1]) == std::vector<std::string>{"3", "2"};
      },
      30s));
  CHECK_THAT(nodes[0]->err() + nodes[1]->err(), Catch::Contains("evicted"));

  // A newcomer is admitted at the next round: everyone restarts as three.
  auto newcomer = std::make_unique<Subprocess>(node(daemon.endpoint, "elastic", flags, steps));
  REQUIRE(eventually(
      [&] {
        return sizes(*nodes[0]) == std::vector<std::string>{"3", "2", "3"} &&
               sizes(*nodes[1]) == std::vector<std::string>{"3", "2", "3"} &&
               sizes(*newcomer) == std::vector<std::string>{"3"};
      },
      30s));
  // Membership changes spend no restart.
  CHECK(values(nodes[0]->out(), "TORCHELASTIC_RESTART_COUNT") ==
        std::vector<std::string>{"0", "0", "0"});

  std::ofstream(done) << "";
  for (auto* p : {nodes[0].get(), nodes[1].get(), newcomer.get()}) {
    auto r = p->wait(30s);
    REQUIRE(r);
    INFO(r->err);
    CHECK(r->exit_code == 0);
  }
  // The run is closed now: a late node is turned away at once.
  auto late = run(node(daemon.endpoint, "elastic", flags, {"env"}), {}, 30s);
  CHECK(late.exit_code == 1);
  CHECK_THAT(late.err, Catch::Contains("is closed"));
}

TEST_CASE("A node with the wrong token is refused at once", "[multinode][integration]") {
  TempDir dir;
  std::ofstream(dir.path() + "/token") << "the-token\n";
  Daemon daemon({"--token-file", dir.path() + "/token"});
  auto refused = run(node(daemon.endpoint, "tok", {"--nnodes", "1"}, {"env"}),
                     {{"CXXLAUNCH_TOKEN", "not-the-token"}}, 30s);
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.err, Catch::Contains("missing or wrong job token"));
  auto admitted =
      run(node(daemon.endpoint, "tok",
               {"--nnodes", "1", "--rdzv_conf", "token_file=" + dir.path() + "/token"}, {"env"}),
          {}, 30s);
  CHECK(admitted.exit_code == 0);
  CHECK(values(admitted.out, "CXXLAUNCH_STORE_PREFIX") == std::vector<std::string>{"tok/1"});
}

TEST_CASE("A rendezvous that never completes times out naming who is missing",
          "[multinode][integration]") {
  Daemon daemon;
  auto r = run(
      node(daemon.endpoint, "lonely", {"--nnodes", "2", "--rdzv_conf", "join_timeout=1"}, {"env"}),
      {}, 30s);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("did not complete within 1 s"));
  CHECK_THAT(r.err, Catch::Contains("1 of 2 nodes joined"));
}

// An endpoint that nothing listens on is waited for (the server may come up later); one held by
// another program that answers is an error within seconds, naming it, not a join timeout later.
TEST_CASE("A rendezvous endpoint held by another program is named at once",
          "[multinode][integration]") {
  ForeignListener http("HTTP/1.1 200 OK\r\n\r\nhello");
  const auto start = std::chrono::steady_clock::now();
  auto r = run(node(http.endpoint, "foreign", {"--nnodes", "1"}, {"env"}), {}, 30s);
  INFO(r.err);
  CHECK(std::chrono::steady_clock::now() - start < 10s);  // was the join timeout: 60 s here
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains(http.endpoint + " answered but is not a cxxlaunch rendezvous "
                                                    "server"));
  CHECK_THAT(r.err, Catch::Contains("HTTP/1.1 200 OK\\r\\n\\r\\nhello"));
  CHECK(values(r.out, "RANK").empty());  // nothing was spawned
}

// A listener that accepts and stays silent may be a stopped server: it is waited for like one,
// until the join timeout, whose message says what was found there.
TEST_CASE("A silent listener at the rendezvous endpoint is waited for, then named",
          "[multinode][integration]") {
  ForeignListener silent("");
  const auto start = std::chrono::steady_clock::now();
  auto r = run(
      node(silent.endpoint, "silent", {"--nnodes", "1", "--rdzv_conf", "join_timeout=3"}, {"env"}),
      {}, 30s);
  const auto took = std::chrono::steady_clock::now() - start;
  INFO(r.err);
  CHECK(took >= 3s);
  CHECK(took < 10s);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("did not complete within 3 s"));
  CHECK_THAT(r.err, Catch::Contains(silent.endpoint + " accepted the connection but sent nothing"));
}

// ---- reliability (docs/reliability.md) ----------------------------------------------------

TEST_CASE("A finished two-node job ends in well under a keep-alive interval",
          "[multinode][integration][reliability]") {
  // keep-alives every 5 s: the node that finishes first must hear of the close at once, not at
  // its next keep-alive.
  const auto start = std::chrono::steady_clock::now();
  const auto results = runNodes(
      2,
      [&](const std::string& endpoint, int n) {
        Args argv = {CXXLAUNCH_BIN,
                     "run",
                     "--rdzv_endpoint",
                     endpoint,
                     "--rdzv_id",
                     "quick",
                     "--nnodes",
                     "2",
                     "--rdzv_conf",
                     "keep_alive_interval=5,last_call_timeout=1,join_timeout=60," + hostConf(n),
                     TEST_WORKER};
        for (const char* step : n == 0 ? std::vector<const char*>{"print", "done"}
                                       : std::vector<const char*>{"sleep", "0.3"}) {
          argv.push_back(step);
        }
        return argv;
      },
      30s);
  const auto& a = results[0];
  const auto& b = results[1];
  const auto took = std::chrono::steady_clock::now() - start;
  REQUIRE(a);
  REQUIRE(b);
  INFO(a->err << b->err);
  CHECK(a->exit_code == 0);
  CHECK(b->exit_code == 0);
  CHECK(took < 3s);  // was 5.1 s: a whole keep-alive interval
}

TEST_CASE("A stopped daemon is noticed within the eviction timeout",
          "[multinode][integration][reliability]") {
  Daemon daemon;
  Subprocess launcher({CXXLAUNCH_BIN, "run", "--rdzv_endpoint", daemon.endpoint, "--rdzv_id",
                       "stopped", "--rdzv_conf",
                       "keep_alive_interval=0.5,keep_alive_max_misses=2,join_timeout=30",
                       TEST_WORKER, "print", "started", "sleep", "60"});
  REQUIRE(eventually([&] { return launcher.out().find("started") != std::string::npos; }, 20s));
  REQUIRE(::kill(daemon.process->pid(), SIGSTOP) == 0);
  const auto stopped = std::chrono::steady_clock::now();
  auto r = launcher.wait(20s);
  const auto took = std::chrono::steady_clock::now() - stopped;
  ::kill(daemon.process->pid(), SIGCONT);
  REQUIRE(r);
  INFO(r->err);
  CHECK(r->exit_code != 0);
  CHECK_THAT(r->err, Catch::Contains("lost the rendezvous server"));
  // 0.5 s x 2 misses = 1 s without an answer; the calls' deadlines never reach past it (was
  // max_misses x (interval + a 10 s call timeout)).
  CHECK(took < 4s);
}

TEST_CASE("A launcher hosting the rendezvous beyond loopback without TLS warns",
          "[multinode][integration][security]") {
  auto r = run({CXXLAUNCH_BIN, "run", "--rdzv_id", "exposed", "--rdzv_endpoint",
                "0.0.0.0:" + std::to_string(freePort()), TEST_WORKER, "print", "ok"},
               {}, 30s);
  INFO(r.err);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.err, Catch::Contains("warning: serving 0.0.0.0 without TLS"));
  CHECK_THAT(r.err, Catch::Contains("can join any job"));
  auto quiet = run({CXXLAUNCH_BIN, "run", "--rdzv_id", "private", "--rdzv_endpoint",
                    "127.0.0.1:" + std::to_string(freePort()), TEST_WORKER, "print", "ok"},
                   {}, 30s);
  CHECK(quiet.err.find("warning: serving") == std::string::npos);
}

TEST_CASE("A stop signal ends a launcher stuck in a call to a stopped daemon within the grace",
          "[multinode][integration][reliability]") {
  Daemon daemon;
  TempDir dir;
  const std::string go = dir.path() + "/go";
  // Keep-alives every 20 s: a call may wait a minute for an answer, signals unread meanwhile.
  Subprocess launcher({CXXLAUNCH_BIN, "run", "--rdzv_endpoint", daemon.endpoint, "--rdzv_id",
                       "deaf", "--shutdown_grace", "1", "--rdzv_conf",
                       "keep_alive_interval=20,keep_alive_max_misses=3,join_timeout=30",
                       TEST_WORKER, "print", "started", "wait-file", go});
  REQUIRE(eventually([&] { return launcher.out().find("started") != std::string::npos; }, 20s));
  REQUIRE(::kill(daemon.process->pid(), SIGSTOP) == 0);
  std::ofstream(go).close();  // the worker succeeds; the launcher tells the stopped daemon
  sleepFor(1s);
  REQUIRE(::kill(launcher.pid(), SIGTERM) == 0);
  const auto signalled = std::chrono::steady_clock::now();
  auto r = launcher.wait(20s);
  const auto took = std::chrono::steady_clock::now() - signalled;
  ::kill(daemon.process->pid(), SIGCONT);
  REQUIRE(r);
  INFO(r->err);
  CHECK(r->exit_code == 128 + SIGTERM);
  CHECK_THAT(r->err, Catch::Contains("cxxlaunch: still running past the shutdown grace after a "
                                     "stop signal; exiting now\n"));
  CHECK(took < 1s + 1s + 1s);  // the grace, the margin (kStopMargin), the timer and slack
}
