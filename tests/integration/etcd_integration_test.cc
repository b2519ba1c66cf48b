// Multi-node jobs whose launchers meet through a real etcd (--rdzv_backend etcd): real
// `cxxlaunch run` processes, a real etcd started by the test (support/etcd.h), SIGKILLs of an
// agent and of etcd itself.

#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <sstream>

#include "support/etcd.h"
#include "support/status_rows.h"
#include "support/subprocess.h"
#include "support/worker_lines.h"
#include "support/worker_pids.h"

using namespace cxxlaunch::testing;
using namespace std::chrono_literals;
using Args = std::vector<std::string>;
namespace fs = std::filesystem;

namespace {

// As multinode_test.cc: keep-alives every 300 ms, eviction (the lease's TTL) after 2.1 s.
const std::string kFastConf =
    "keep_alive_interval=0.3,keep_alive_max_misses=7,last_call_timeout=1,join_timeout=60";

Args node(const std::string& endpoints, const std::string& run_id, const Args& flags,
          const std::string& program, const Args& args, const std::string& conf = kFastConf) {
  Args argv = {CXXLAUNCH_BIN, "run",       "--rdzv_backend", "etcd",        "--rdzv_endpoint",
               endpoints,     "--rdzv_id", run_id,           "--rdzv_conf", conf};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(program);
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

const Args kTrain = {"--model", "mlp", "--steps", "4", "--print_every", "2", "--batch_size", "4"};

// Waits for every launcher, each of which must succeed; their output, together.
std::string outputOfAll(std::vector<std::unique_ptr<Subprocess>>& procs) {
  std::string all;
  for (auto& p : procs) {
    auto r = p->wait(90s);
    REQUIRE(r);
    INFO(r->out << r->err);
    CHECK(r->exit_code == 0);
    all += r->out;
  }
  return all;
}

}  // namespace

TEST_CASE("Two and three launchers train the example through etcd", "[etcd][integration]") {
  EtcdServer etcd;
  for (int nodes : {2, 3}) {
    const std::string run = "train" + std::to_string(nodes);
    const int world = 2 + (nodes - 1);  // 2 workers on the first node, 1 on the others
    // The two-node job names a member that is down first: the launchers and their workers'
    // stores fail over to the live one.
    const std::string endpoints =
        nodes == 2 ? "127.0.0.1:" + std::to_string(freePort()) + "," + etcd.endpoint()
                   : etcd.endpoint();
    std::vector<std::unique_ptr<Subprocess>> procs;
    for (int n = 0; n < nodes; ++n) {
      procs.push_back(std::make_unique<Subprocess>(
          node(endpoints, run,
               {"--nnodes", std::to_string(nodes), "--nproc_per_node", n == 0 ? "2" : "1"},
               TRAIN_BIN, kTrain)));
    }
    const std::string all = outputOfAll(procs);
    // DDP over Gloo, bootstrapped through the workers' EtcdStore.
    CHECK_THAT(all, Catch::Contains("on " + std::to_string(world) + " process(es)"));
    CHECK_THAT(all, Catch::Contains("done: 4 steps"));
    // Cleaned up: the alive keys went with the leases, the store and round keys with the close;
    // the final state stays (under a lease of its own) to turn late nodes away.
    const auto keys = etcd.ctl({"get", "--prefix", "/cxxlaunch/" + run + "/", "--keys-only"});
    CHECK(keys.out.find("/cxxlaunch/" + run + "/state") != std::string::npos);
    CHECK(keys.out.find("/store/") == std::string::npos);
    CHECK(keys.out.find("/alive/") == std::string::npos);
    CHECK(keys.out.find("/round") == std::string::npos);
  }
  // A late node of a closed run is refused at once.
  auto late =
      run(node(etcd.endpoint(), "train2", {"--nnodes", "2"}, TEST_WORKER, {"env"}), {}, 30s);
  CHECK(late.exit_code == 1);
  CHECK_THAT(late.err, Catch::Contains("is closed"));
}

TEST_CASE("A job with --rdzv_conf etcd_prefix keeps its keys under that root",
          "[etcd][integration]") {
  EtcdServer etcd;
  const std::string conf = kFastConf + ",etcd_prefix=/team/jobs";
  std::vector<std::unique_ptr<Subprocess>> procs;
  for (int n = 0; n < 2; ++n) {
    procs.push_back(std::make_unique<Subprocess>(
        node(etcd.endpoint(), "rooted", {"--nnodes", "2"}, TRAIN_BIN, kTrain, conf)));
  }
  // The workers' stores find the round under the same root, or Gloo would never connect.
  const std::string all = outputOfAll(procs);
  CHECK_THAT(all, Catch::Contains("on 2 process(es)") && Catch::Contains("done: 4 steps"));
  CHECK(etcd.ctl({"get", "--prefix", "/team/jobs/rooted/", "--keys-only"}).out.find("/state") !=
        std::string::npos);
  CHECK(etcd.ctl({"get", "--prefix", "/cxxlaunch/", "--keys-only"}).out.empty());
  Args status = {CXXLAUNCH_BIN,     "status",        "--rdzv_backend", "etcd",
                 "--rdzv_endpoint", etcd.endpoint(), "--rdzv_id",      "rooted"};
  auto elsewhere = run(status);
  CHECK(elsewhere.exit_code != 0);
  CHECK_THAT(elsewhere.err, Catch::Contains("no run 'rooted'"));
  status.insert(status.end(), {"--rdzv_conf", "etcd_prefix=/team/jobs"});
  auto found = run(status);
  INFO(found.out << found.err);
  CHECK(found.exit_code == 0);
  CHECK_THAT(found.out, Catch::Contains("round 1: closed"));
}

TEST_CASE("cxxlaunch status through etcd shows each worker's progress and a stopped one as silent",
          "[etcd][integration][status]") {
  // As the cxxlaunchd test of the same name: both ranks beat every 0.1 s until rank 1 is
  // stopped; the node's keep-alives carry their progress into etcd.
  EtcdServer etcd;
  TempDir pids;
  Subprocess launcher(node(etcd.endpoint(), "silent", {"--nproc_per_node=2"}, TEST_WORKER,
                           {"pidfile", pids.path(), "beating"},
                           "keep_alive_interval=0.2,keep_alive_max_misses=10"));
  const auto workers = waitForPids(pids.path(), 2);
  checkStoppedWorkerIsSilent(
      [&] {
        return run({CXXLAUNCH_BIN, "status", "--rdzv_backend", "etcd", "--rdzv_endpoint",
                    etcd.endpoint(), "--rdzv_id", "silent", "--silent_after", "3"})
            .out;
      },
      workers);
  ::kill(launcher.pid(), SIGTERM);
  auto r = launcher.wait(30s);
  REQUIRE(r);
  CHECK(r->exit_code == 128 + SIGTERM);
}

TEST_CASE("Over etcd, a worker failure restarts every node until the global count runs out",
          "[etcd][integration]") {
  EtcdServer etcd;
  // Rank 3 (the second node's second worker) always fails; one restart is allowed job-wide.
  const Args steps = {"env", "rank", "3", "exit", "3", "rank", "all", "sleep", "30"};
  const Args flags = {"--nnodes", "2", "--nproc_per_node", "2", "--max_restarts", "1"};
  Subprocess a(node(etcd.endpoint(), "restarts", flags, TEST_WORKER, steps));
  Subprocess b(node(etcd.endpoint(), "restarts", flags, TEST_WORKER, steps));
  auto ra = a.wait(60s), rb = b.wait(60s);
  REQUIRE(ra);
  REQUIRE(rb);
  INFO(ra->out << ra->err << rb->out << rb->err);
  CHECK(ra->exit_code == 3);  // the root cause's exit code, on both nodes
  CHECK(rb->exit_code == 3);
  // One restart job-wide, and only one. A node that reads the state only after round 1 was
  // already superseded (the other node's worker fails at once) joins round 2 directly: its only
  // attempt has count 1 (docs/rendezvous.md, "etcd").
  for (const auto* r : {&*ra, &*rb}) {
    auto counts = values(r->out, "TORCHELASTIC_RESTART_COUNT");
    const std::set<std::string> seen(counts.begin(), counts.end());
    CHECK((seen == std::set<std::string>{"0", "1"} || seen == std::set<std::string>{"1"}));
    const auto prefixes = values(r->out, "CXXLAUNCH_STORE_PREFIX");
    REQUIRE_FALSE(prefixes.empty());
    CHECK(prefixes.back() == "restarts/2");
  }
  CHECK_THAT(ra->err + rb->err, Catch::Contains("the job failed: rank 3 exit 3 on node"));
}

TEST_CASE("Elastic over etcd: a SIGKILLed agent's lease expires and the survivors re-form",
          "[etcd][integration]") {
  EtcdServer etcd;
  TempDir dir;
  const std::string done = dir.path() + "/done";
  const Args flags = {"--nnodes", "2:3", "--nproc_per_node", "1"};
  const Args steps = {"env", "pidfile", dir.path(), "wait-file", done};
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int n = 0; n < 3; ++n) {
    nodes.push_back(
        std::make_unique<Subprocess>(node(etcd.endpoint(), "elastic", flags, TEST_WORKER, steps)));
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
  // cxxlaunch status reads the run's state from etcd.
  auto status = run({CXXLAUNCH_BIN, "status", "--rdzv_backend", "etcd", "--rdzv_endpoint",
                     etcd.endpoint(), "--rdzv_id", "elastic"});
  INFO(status.out << status.err);
  CHECK(status.exit_code == 0);
  CHECK_THAT(status.out, Catch::Contains("round 1: running; nodes 2:3"));
  size_t listed = 0;
  for (size_t at = status.out.find("127.0.0.1_"); at != std::string::npos;
       at = status.out.find("127.0.0.1_", at + 1)) {
    ++listed;
  }
  CHECK(listed == 3);  // every node, by id
  const std::string victim_rank = values(nodes[2]->out(), "RANK").at(0);
  REQUIRE(eventually([&] { return fs::exists(dir.path() + "/rank" + victim_rank + ".pid"); }, 10s));
  ::kill(nodes[2]->pid(), SIGKILL);
  REQUIRE(nodes[2]->wait(5s));

  // No one revoked its lease: it expires (2.1 s), its alive key vanishes, a survivor evicts it.
  const auto killed_at = std::chrono::steady_clock::now();
  REQUIRE(eventually(
      [&] {
        return sizes(*nodes[0]) == std::vector<std::string>{"3", "2"} &&
               sizes(*nodes[1]) == std::vector<std::string>{"3", "2"};
      },
      30s));
  CHECK(std::chrono::steady_clock::now() - killed_at < 15s);
  CHECK_THAT(nodes[0]->err() + nodes[1]->err(), Catch::Contains("its lease expired"));
  CHECK(values(nodes[0]->out(), "TORCHELASTIC_RESTART_COUNT") ==
        std::vector<std::string>{"0", "0"});  // membership changes spend no restart

  std::ofstream(done) << "";
  for (auto* p : {nodes[0].get(), nodes[1].get()}) {
    auto r = p->wait(30s);
    REQUIRE(r);
    INFO(r->err);
    CHECK(r->exit_code == 0);
  }
}

TEST_CASE("etcd SIGKILLed and restarted mid-rendezvous: the agents retry and complete",
          "[etcd][integration]") {
  EtcdServer etcd;
  const Args flags = {"--nnodes", "2", "--nproc_per_node", "1"};
  Subprocess first(node(etcd.endpoint(), "restart", flags, TEST_WORKER, {"env"}));
  // The first node has joined (its alive key is there) ...
  REQUIRE(eventually(
      [&] {
        return etcd.ctl({"get", "--prefix", "/cxxlaunch/restart/alive/", "--keys-only"})
                   .out.find("alive") != std::string::npos;
      },
      20s));
  // ... when etcd dies; the second node starts while it is down; etcd comes back 1.5 s later.
  etcd.kill();
  Subprocess second(node(etcd.endpoint(), "restart", flags, TEST_WORKER, {"env"}));
  sleepFor(1500ms);
  etcd.start();
  const auto back_at = std::chrono::steady_clock::now();
  for (auto* p : {&first, &second}) {
    auto r = p->wait(60s);
    REQUIRE(r);
    INFO(r->out << r->err);
    CHECK(r->exit_code == 0);
    CHECK(values(r->out, "GROUP_WORLD_SIZE") == std::vector<std::string>{"2"});
  }
  // Found again at once: a gRPC channel left in TRANSIENT_FAILURE once took 13 s here.
  CHECK(std::chrono::steady_clock::now() - back_at < 8s);
}

TEST_CASE("A three-member etcd loses the member the agents talk to: the job goes on",
          "[etcd][integration]") {
  EtcdCluster etcd;
  TempDir dir;
  const std::string done = dir.path() + "/done";
  const Args flags = {"--nnodes", "2", "--nproc_per_node", "1"};
  const Args steps = {"env", "wait-file", done};
  Subprocess a(node(etcd.endpoints(), "members", flags, TEST_WORKER, steps));
  Subprocess b(node(etcd.endpoints(), "members", flags, TEST_WORKER, steps));
  REQUIRE(eventually(
      [&] {
        return values(a.out(), "GROUP_WORLD_SIZE").size() == 1 &&
               values(b.out(), "GROUP_WORLD_SIZE").size() == 1;
      },
      30s));
  // Every client talks to member 0 first; it dies while the workers run. The agents' keep-alives
  // and leases move to the others, within the eviction timeout: no one is evicted.
  etcd.kill(0);
  sleepFor(3s);  // longer than the leases' TTL
  std::ofstream(done) << "";
  for (auto* p : {&a, &b}) {
    auto r = p->wait(30s);
    REQUIRE(r);
    INFO(r->out << r->err);
    CHECK(r->exit_code == 0);
    CHECK(values(r->out, "GROUP_WORLD_SIZE") == std::vector<std::string>{"2"});  // no re-form
  }
}

TEST_CASE("etcd gone for good: a join fails within its timeout, naming etcd",
          "[etcd][integration]") {
  EtcdServer etcd;
  const std::string endpoint = etcd.endpoint();
  etcd.kill();
  const auto start = std::chrono::steady_clock::now();
  auto r = run(node(endpoint, "gone", {"--nnodes", "2"}, TEST_WORKER, {"env"},
                    kFastConf + ",join_timeout=3"),
               {}, 30s);
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Catch::Contains("did not complete within 3 s"));
  CHECK_THAT(r.err, Catch::Contains("no member reachable at " + endpoint));
}

TEST_CASE("With etcd auth on, a wrong password is refused in one line with exit code 2",
          "[etcd][integration][security]") {
  EtcdServer etcd;
  etcd.enableAuth("s3cret");
  TempDir dir;
  std::ofstream(dir.path() + "/password") << "s3cret\n";
  auto refused = run(node(etcd.endpoint(), "auth", {"--nnodes", "1"}, TEST_WORKER, {"env"},
                          kFastConf + ",user=root,password=wrong"),
                     {}, 30s);
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.err,
             Catch::Contains("refused user 'root'") && Catch::Contains("authentication failed"));
  CHECK(std::count(refused.err.begin(), refused.err.end(), '\n') == 1);  // one line
  // The right password (from a file): the launcher and its workers' store authenticate.
  auto admitted =
      run(node(etcd.endpoint(), "auth", {"--nnodes", "1", "--nproc_per_node", "2"}, TRAIN_BIN,
               kTrain, kFastConf + ",user=root,password_file=" + dir.path() + "/password"),
          {}, 60s);
  INFO(admitted.out << admitted.err);
  CHECK(admitted.exit_code == 0);
  CHECK_THAT(admitted.out, Catch::Contains("done: 4 steps"));
}

TEST_CASE("Two launchers train through an etcd that requires mutual TLS",
          "[etcd][integration][security]") {
  TempDir dir;
  const std::string d = dir.path();
  // One certificate for the server and the clients alike (its SAN and key usages fit both).
  const std::string script =
      "set -e; cd " + d +
      "; ec='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes';"
      "openssl req -x509 $ec -days 1 -subj /CN=test-ca -keyout ca.key -out ca.crt 2>/dev/null;"
      "openssl req $ec -subj /CN=node -keyout node.key -out node.csr 2>/dev/null;"
      "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\nextendedKeyUsage=serverAuth,"
      "clientAuth\\n' > node.ext;"
      "openssl x509 -req -in node.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 "
      "-extfile node.ext -out node.crt 2>/dev/null";
  REQUIRE(run({"/bin/sh", "-c", script}).exit_code == 0);
  EtcdServer etcd(EtcdTls{d + "/ca.crt", d + "/node.crt", d + "/node.key"});
  const std::string tls = ",cacert=" + d + "/ca.crt,cert=" + d + "/node.crt,key=" + d + "/node.key";
  // Nothing here is about eviction: leases of 9 s, not 2.1 s, so that a TLS keep-alive late on a
  // loaded machine does not evict a node (seen once beside parallel builds and benchmarks).
  const std::string conf =
      "keep_alive_interval=0.3,keep_alive_max_misses=30,last_call_timeout=1,join_timeout=60" + tls;
  std::vector<std::unique_ptr<Subprocess>> procs;
  for (int n = 0; n < 2; ++n) {
    procs.push_back(std::make_unique<Subprocess>(
        node(etcd.endpoint(), "tls", {"--nnodes", "2"}, TRAIN_BIN, kTrain, conf)));
  }
  const std::string all = outputOfAll(procs);
  CHECK_THAT(all, Catch::Contains("on 2 process(es)") && Catch::Contains("done: 4 steps"));
  // Without TLS the handshake never completes: the join times out naming the member.
  auto plain = run(node(etcd.endpoint(), "tls-plain", {"--nnodes", "1"}, TEST_WORKER, {"env"},
                        kFastConf + ",join_timeout=2"),
                   {}, 30s);
  CHECK(plain.exit_code == 1);
  CHECK_THAT(plain.err, Catch::Contains("no member reachable at " + etcd.endpoint()));
}
