// A server that starts gRPC when its first client connects (start_on_first_connection), as a
// single-node launcher hosts its own: the port is known and held at once, the hosting node is
// served at once, and the first client's connection is handed to gRPC once it has started.

#include <catch2/catch.hpp>

#include "common/error.h"
#include "rendezvous/client.h"
#include "rendezvous/server.h"
#include "support/subprocess.h"

using namespace cxxlaunch;
using namespace cxxlaunch::rendezvous;
using namespace std::chrono_literals;

namespace {

ServerOptions atFirstConnection() {
  ServerOptions options;
  options.start_on_first_connection = true;
  return options;
}

RunSettings solo() {
  RunSettings s;
  s.min_nodes = 1;
  s.max_nodes = 1;
  s.last_call_timeout = 100ms;
  s.keep_alive_interval = 2s;
  return s;
}

NodeSpec host() {
  NodeSpec n;
  n.id = "host";
  n.addr = "127.0.0.1";
  n.local_world_size = 2;
  n.master_port = 1234;
  return n;
}

ClientOptions clientOf(const RendezvousServer& server) {
  ClientOptions o;
  o.endpoint = server.endpoint();
  o.call_timeout = 10s;
  return o;
}

}  // namespace

TEST_CASE(
    "A server started at its first connection serves its node at once and its workers' "
    "stores from their first call",
    "[server][local]") {
  RendezvousServer server(atFirstConnection());
  REQUIRE(server.port() > 0);
  std::atomic<bool> never = false;
  // Before gRPC has started: the direct join needs none of it.
  const JoinPoll poll = server.join("job", host(), solo(), 1s, never);
  REQUIRE(poll.placement);
  // A worker's store: its connection starts gRPC, which takes it over.
  GrpcStore store(clientOf(server), "job", poll.placement->round);
  store.set("k", "v");
  CHECK(store.get("k", 1s) == "v");
  server.checkStarted();
  RendezvousClient client(clientOf(server), "job");
  CHECK(client.leave("host", poll.placement->round).action == Action::kClosed);
}

TEST_CASE("A server started at its first connection holds its port throughout", "[server]") {
  RendezvousServer first(atFirstConnection());
  ServerOptions same;
  same.port = first.port();
  // Taken before gRPC listens (the door) and after (gRPC's own socket).
  REQUIRE_THROWS_AS(RendezvousServer(same), CommunicationError);
  std::atomic<bool> never = false;
  const JoinPoll poll = first.join("job", host(), solo(), 1s, never);
  REQUIRE(poll.placement);
  GrpcStore(clientOf(first), "job", poll.placement->round).set("k", "v");
  first.checkStarted();
  REQUIRE_THROWS_AS(RendezvousServer(same), CommunicationError);
}

TEST_CASE("A store whose server went away after answering fails at once", "[server][store]") {
  auto server = std::make_unique<RendezvousServer>(atFirstConnection());
  std::atomic<bool> never = false;
  const JoinPoll poll = server->join("job", host(), solo(), 1s, never);
  REQUIRE(poll.placement);
  ClientOptions options = clientOf(*server);
  options.call_timeout = 10min;  // a wait for the server would outlast the test's limit
  GrpcStore store(options, "job", poll.placement->round);
  store.set("k", "v");
  server.reset();
  REQUIRE_THROWS_WITH(store.set("k", "w"), Catch::Contains("could not connect"));
}

TEST_CASE("A store given an endpoint where nothing listens fails at once", "[server][store]") {
  ClientOptions options;
  options.endpoint = "127.0.0.1:" + std::to_string(cxxlaunch::testing::freePort());
  options.call_timeout = 10min;  // a wait for a server would outlast the test's limit
  GrpcStore store(options, "job", 0);
  REQUIRE_THROWS_WITH(store.set("k", "v"), Catch::Contains("could not connect"));
}
