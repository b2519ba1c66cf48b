// The rendezvous server tests' shared setup: run settings, node specs, clients, and a join that
// waits until placed. Header-only, used by server_test.cc and server_limits_test.cc.
#pragma once

#include <chrono>
#include <stdexcept>
#include <string>

#include "rendezvous/client.h"
#include "rendezvous/server.h"

namespace cxxlaunch::rendezvous::server_fixture {

using namespace std::chrono_literals;

inline RunSettings settings(int min, int max, int max_restarts = 0) {
  RunSettings s;
  s.min_nodes = min;
  s.max_nodes = max;
  s.max_restarts = max_restarts;
  s.last_call_timeout = 100ms;
  s.keep_alive_interval = 2s;
  return s;
}

inline NodeSpec node(const std::string& id, int local = 1) {
  NodeSpec n;
  n.id = id;
  n.addr = "127.0.0.1";
  n.local_world_size = local;
  n.master_port = 1234;
  return n;
}

inline ClientOptions clientFor(const RendezvousServer& server, const std::string& token = "") {
  ClientOptions o;
  o.endpoint = server.endpoint();
  o.token = token;
  o.call_timeout = 5s;
  return o;
}

// Joins until placed; fails the test after 10 s.
inline Placement joinUntilPlaced(RendezvousClient& client, const NodeSpec& n,
                                 const RunSettings& s) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    auto poll = client.join(n, s, 1s);
    if (poll.placement) return *poll.placement;
  }
  throw std::runtime_error("join did not complete");
}

// A one-node run, placed, for store tests.
inline Placement soloRun(const RendezvousServer& server, const std::string& run_id,
                         const std::string& token = "") {
  RendezvousClient client(clientFor(server, token), run_id);
  return joinUntilPlaced(client, node("solo"), settings(1, 1));
}

}  // namespace cxxlaunch::rendezvous::server_fixture
