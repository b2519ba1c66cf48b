#pragma once
// Test helper: a real etcd (Debian's etcd-server, scripts/setup.sh installs it) on free loopback
// ports with its data in a temporary folder, for the tests of targets that define ETCD_BIN and
// ETCDCTL_BIN. kill() SIGKILLs it, start() starts it again on the same ports and data; the
// destructor kills it. No etcd on the machine fails the test (it does not skip): the etcd
// backend is then untested, and the message says what to install.

#include <signal.h>

#include <catch2/catch.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "support/subprocess.h"

namespace cxxlaunch::testing {

// TLS files for a server that requires client certificates signed by `ca` (mutual TLS).
struct EtcdTls {
  std::string ca, cert, key;
};

class EtcdServer {
 public:
  explicit EtcdServer(std::optional<EtcdTls> tls = std::nullopt) : tls_(std::move(tls)) {
    INFO("etcd not found at '" ETCD_BIN
         "': install etcd-server and etcd-client (scripts/setup.sh)");
    REQUIRE(std::string(ETCD_BIN).find('/') != std::string::npos);
    for (int attempt = 0; attempt < 3; ++attempt) {
      client_port_ = freePort();
      peer_port_ = freePort();
      if (startOnce()) return;
    }
    FAIL("etcd did not start: " << (process_ ? process_->err() : std::string()));
  }
  ~EtcdServer() { kill(); }

  // host:port of its client URL.
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }
  pid_t pid() const { return process_ ? process_->pid() : -1; }

  void kill() {
    if (!process_) return;
    ::kill(process_->pid(), SIGKILL);
    process_->wait(std::chrono::seconds(10));
    process_.reset();
  }

  // Again on the same ports and data (after kill()).
  void start() {
    for (int attempt = 0; attempt < 50 && !startOnce(); ++attempt) {
      sleepFor(std::chrono::milliseconds(100));  // the old ports may take a moment to free
    }
    REQUIRE(process_);
  }

  // etcdctl against this server; `args` after the global flags.
  Finished ctl(const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {ETCDCTL_BIN, "--endpoints", endpoint()};
    addTlsFlags(argv);
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv, {{"ETCDCTL_API", "3"}}, std::chrono::seconds(20));
  }

  // Users root (password `password`, role root) and auth on.
  void enableAuth(const std::string& password) const {
    REQUIRE(ctl({"user", "add", "root:" + password}).exit_code == 0);
    ctl({"role", "add", "root"});  // etcd may have made it already
    ctl({"user", "grant-role", "root", "root"});
    const Finished on = ctl({"auth", "enable"});
    INFO(on.out << on.err);
    REQUIRE(on.exit_code == 0);
  }

 private:
  void addTlsFlags(std::vector<std::string>& argv) const {
    if (!tls_) return;
    argv.insert(argv.end(), {"--cacert", tls_->ca, "--cert", tls_->cert, "--key", tls_->key});
  }

  bool startOnce() {
    const std::string client = (tls_ ? "https://" : "http://") + endpoint();
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    // Short raft timers: a one-member cluster elects itself in ~0.1 s, not ~1 s.
    std::vector<std::string> argv = {ETCD_BIN,
                                     "--name",
                                     "test",
                                     "--data-dir",
                                     dir_.path() + "/data",
                                     "--listen-client-urls",
                                     client,
                                     "--advertise-client-urls",
                                     client,
                                     "--listen-peer-urls",
                                     peer,
                                     "--initial-advertise-peer-urls",
                                     peer,
                                     "--initial-cluster",
                                     "test=" + peer,
                                     "--heartbeat-interval",
                                     "20",
                                     "--election-timeout",
                                     "200",
                                     "--log-level",
                                     "warn",
                                     "--logger",
                                     "zap"};
    if (tls_) {
      argv.insert(argv.end(), {"--cert-file", tls_->cert, "--key-file", tls_->key,
                               "--trusted-ca-file", tls_->ca, "--client-cert-auth"});
    }
    process_ = std::make_unique<Subprocess>(argv);
    const bool up = eventually(
        [&] {
          if (!alive(process_->pid())) return true;
          return ctlQuiet();
        },
        std::chrono::seconds(20));
    if (up && alive(process_->pid())) return true;
    process_->wait(std::chrono::seconds(5));
    return false;
  }

  bool ctlQuiet() const {
    std::vector<std::string> argv = {ETCDCTL_BIN, "--endpoints", endpoint(), "--command-timeout",
                                     "1s"};
    addTlsFlags(argv);
    argv.insert(argv.end(), {"endpoint", "health"});
    return run(argv, {{"ETCDCTL_API", "3"}}, std::chrono::seconds(10)).exit_code == 0;
  }

  std::optional<EtcdTls> tls_;
  TempDir dir_;
  int client_port_ = 0;
  int peer_port_ = 0;
  std::unique_ptr<Subprocess> process_;
};

// A real three-member etcd cluster on loopback (a quorum survives one member's SIGKILL).
class EtcdCluster {
 public:
  static constexpr int kMembers = 3;

  EtcdCluster() {
    REQUIRE(std::string(ETCD_BIN).find('/') != std::string::npos);
    std::string initial;
    for (int i = 0; i < kMembers; ++i) {
      client_ports_.push_back(freePort());
      peer_ports_.push_back(freePort());
      initial += (i ? "," : "") + name(i) + "=" + peer(i);
    }
    for (int i = 0; i < kMembers; ++i) {
      members_.push_back(
          std::make_unique<Subprocess>(std::vector<std::string>{ETCD_BIN,
                                                                "--name",
                                                                name(i),
                                                                "--data-dir",
                                                                dir_.path() + "/" + name(i),
                                                                "--listen-client-urls",
                                                                "http://" + endpoint(i),
                                                                "--advertise-client-urls",
                                                                "http://" + endpoint(i),
                                                                "--listen-peer-urls",
                                                                peer(i),
                                                                "--initial-advertise-peer-urls",
                                                                peer(i),
                                                                "--initial-cluster",
                                                                initial,
                                                                "--initial-cluster-state",
                                                                "new",
                                                                "--heartbeat-interval",
                                                                "20",
                                                                "--election-timeout",
                                                                "200",
                                                                "--log-level",
                                                                "warn",
                                                                "--logger",
                                                                "zap"}));
    }
    const bool up = eventually(
        [&] {
          return run({ETCDCTL_BIN, "--endpoints", endpoints(), "--command-timeout", "1s",
                      "endpoint", "health"},
                     {{"ETCDCTL_API", "3"}}, std::chrono::seconds(10))
                     .exit_code == 0;
        },
        std::chrono::seconds(30));
    INFO(members_[0]->err());
    REQUIRE(up);
  }
  ~EtcdCluster() {
    for (int i = 0; i < kMembers; ++i) kill(i);
  }

  std::string endpoint(int i) const { return "127.0.0.1:" + std::to_string(client_ports_[i]); }
  // Every member, comma-separated, member 0 first.
  std::string endpoints() const {
    std::string out;
    for (int i = 0; i < kMembers; ++i) out += (i ? "," : "") + endpoint(i);
    return out;
  }

  void kill(int i) {
    if (!members_[i]) return;
    ::kill(members_[i]->pid(), SIGKILL);
    members_[i]->wait(std::chrono::seconds(10));
    members_[i].reset();
  }

 private:
  static std::string name(int i) { return "m" + std::to_string(i); }
  std::string peer(int i) const { return "http://127.0.0.1:" + std::to_string(peer_ports_[i]); }

  TempDir dir_;
  std::vector<int> client_ports_, peer_ports_;
  std::vector<std::unique_ptr<Subprocess>> members_;
};

}  // namespace cxxlaunch::testing
