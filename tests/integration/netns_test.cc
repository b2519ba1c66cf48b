// Two nodes as two network namespaces (`ip netns`), joined by a veth pair with addresses of
// their own: a job across them takes the path it takes across machines (addresses, interface
// detection, Gloo's TCP), not loopback's. Both namespaces share this machine's host name, and it
// resolves to a loopback address in both (/etc/hosts), the case where PyTorch's Gloo binds to
// 127.0.0.1 and a job across nodes fails unless told the interface (GLOO_SOCKET_IFNAME).
//
// Only where namespaces can be made (root, iproute2); elsewhere every test exits 77 (skipped).

#define CATCH_CONFIG_RUNNER
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "support/skip_main.h"
#include "support/subprocess.h"

using namespace cxxlaunch::testing;
using namespace std::chrono_literals;
using Args = std::vector<std::string>;
using Env = std::map<std::string, std::string>;

namespace {

bool sh(const std::string& command) {
  return run({"/bin/sh", "-c", command + " >/dev/null 2>&1"}, {}, 30s).exit_code == 0;
}

// Two namespaces "<tag>a" and "<tag>b" with one end of a veth pair each: 10.X.Y.1/24 and
// 10.X.Y.2/24, X.Y from the process id so that concurrent runs do not meet. Removed at the end
// (deleting a namespace deletes its end of the pair, and with it the pair).
class TwoHosts {
 public:
  TwoHosts() {
    const int pid = static_cast<int>(::getpid());
    tag_ = "cxl" + std::to_string(pid);
    subnet_ = "10." + std::to_string(100 + pid % 150) + "." + std::to_string((pid / 150) % 250);
    ok_ =
        sh("set -e; ip netns add " + ns(0) + "; ip netns add " + ns(1) + "; ip link add " +
           veth(0) + " type veth peer name " + veth(1) + "; ip link set " + veth(0) + " netns " +
           ns(0) + "; ip link set " + veth(1) + " netns " + ns(1) + exec(0) + "ip link set lo up" +
           exec(1) + "ip link set lo up" + exec(0) + "ip addr add " + address(0) + "/24 dev " +
           veth(0) + exec(1) + "ip addr add " + address(1) + "/24 dev " + veth(1) + exec(0) +
           "ip link set " + veth(0) + " up" + exec(1) + "ip link set " + veth(1) + " up");
  }
  ~TwoHosts() {
    sh("ip netns del " + ns(0));
    sh("ip netns del " + ns(1));
  }
  TwoHosts(const TwoHosts&) = delete;
  TwoHosts& operator=(const TwoHosts&) = delete;

  bool ok() const { return ok_; }
  std::string ns(int n) const { return tag_ + (n == 0 ? "a" : "b"); }
  std::string veth(int n) const { return tag_ + (n == 0 ? "va" : "vb"); }
  std::string address(int n) const { return subnet_ + (n == 0 ? ".1" : ".2"); }
  // `argv` as run in host n's namespace.
  Args in(int n, const Args& argv) const {
    Args full = {"/usr/bin/env", "ip", "netns", "exec", ns(n)};
    full.insert(full.end(), argv.begin(), argv.end());
    return full;
  }

 private:
  std::string exec(int n) const { return "; ip netns exec " + ns(n) + " "; }
  std::string tag_, subnet_;
  bool ok_ = false;
};

// One launcher per host, one worker each; host 0 hosts the rendezvous at its veth address.
std::vector<Finished> acrossHosts(const TwoHosts& hosts, const Args& program, const Env& env = {}) {
  const std::string endpoint = hosts.address(0) + ":29400";
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int n = 0; n < 2; ++n) {
    Args argv = {CXXLAUNCH_BIN,      "run",   "--nnodes",        "2",
                 "--nproc_per_node", "1",     "--rdzv_endpoint", endpoint,
                 "--rdzv_id",        "netns", "--rdzv_conf",     "join_timeout=60"};
    argv.insert(argv.end(), program.begin(), program.end());
    nodes.push_back(std::make_unique<Subprocess>(hosts.in(n, argv), env));
  }
  std::vector<Finished> results;
  for (auto& node : nodes) {
    auto finished = node->wait(240s);
    results.push_back(finished ? *finished : Finished{-1, node->out(), node->err()});
  }
  return results;
}

std::string hostsLine(const std::string& name) {
  return run({"/usr/bin/env", "getent", "hosts", name}, {}, 10s).out;
}

}  // namespace

TEST_CASE(
    "A stock PyTorch DDP script runs across two network namespaces whose host name is "
    "loopback",
    "[netns][integration]") {
  TwoHosts hosts;
  REQUIRE(hosts.ok());
  // The trap this is about: the shared host name resolves to loopback in both namespaces.
  const std::string name = run({"/usr/bin/env", "hostname"}, {}, 10s).out;
  INFO("host name " << name << " resolves to " << hostsLine(name.substr(0, name.find('\n'))));
  const auto results = acrossHosts(
      hosts, {"/bin/sh", "-c",
              "echo IFNAME=$GLOO_SOCKET_IFNAME NCCL=$NCCL_SOCKET_IFNAME ADDR=$CXXLAUNCH_NODE_ADDR;"
              " exec " SYSTEM_PYTHON " " DDP_SCRIPT});
  for (int n = 0; n < 2; ++n) {
    const Finished& r = results[static_cast<size_t>(n)];
    INFO("host " << n << ": " << r.out << r.err);
    CHECK(r.exit_code == 0);
    const std::string veth = hosts.veth(n);
    CHECK_THAT(r.out,
               Catch::Contains("IFNAME=" + veth + " NCCL=" + veth + " ADDR=" + hosts.address(n)));
    CHECK_THAT(r.out, Catch::Contains("rank " + std::to_string(n) + "/2 ddp ok"));
  }
}

TEST_CASE("The example trainer runs across two network namespaces over Gloo's TCP path",
          "[netns][integration]") {
  TwoHosts hosts;
  REQUIRE(hosts.ok());
  const auto results = acrossHosts(
      hosts,
      {TRAIN_BIN, "--model", "mlp", "--steps", "20", "--print_every", "10", "--batch_size", "8"},
      {{"CXXLAUNCH_SHARED_MEMORY", "off"}});
  for (int n = 0; n < 2; ++n) {
    const Finished& r = results[static_cast<size_t>(n)];
    INFO("host " << n << ": " << r.out << r.err);
    CHECK(r.exit_code == 0);
  }
  // Rank 0 (host 0) says what it trained on and that it finished.
  CHECK_THAT(results[0].out,
             Catch::Contains("on 2 process(es)") && Catch::Contains("done: 20 steps"));
}

int main(int argc, char** argv) {
  return cxxlaunch::testing::runUnlessMissing(argc, argv, []() -> std::string {
    if (::geteuid() != 0) return "network namespaces need root";
    TwoHosts probe;
    if (!probe.ok()) return "'ip netns add' or a veth pair failed here (iproute2, privileges)";
    if (run({SYSTEM_PYTHON, "-c", "import torch"}, {}, 120s).exit_code != 0) {
      return "'" SYSTEM_PYTHON " -c \"import torch\"' failed (install python3-torch)";
    }
    return "";
  });
}
