// A server started in the background (ServerOptions::start_in_background), as a single-node
// launcher starts its own while its workers start: the port is known and held at once, the
// hosting node is served at once, and gRPC clients that come first wait for it.

#include <catch2/catch.hpp>

#include "common/error.h"
#include "rendezvous/client.h"
#include "rendezvous/server.h"

using namespace cxxlaunch;
using namespace cxxlaunch::rendezvous;
using namespace std::chrono_literals;

namespace {

ServerOptions inBackground() {
  ServerOptions options;
  options.start_in_background = true;
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

TEST_CASE("A server started in the background serves its node at once and its workers' stores "
          "once it listens",
          "[server][local]") {
  RendezvousServer server(inBackground());
  REQUIRE(server.port() > 0);
  std::atomic<bool> never = false;
  // Before gRPC may have started: the direct join needs none of it.
  const JoinPoll poll = server.join("job", host(), solo(), 1s, never);
  REQUIRE(poll.placement);
  // A worker's store, made at once (gRPC usually still starting): its first call waits for the
  // server instead of failing with "failed to connect".
  GrpcStore store(clientOf(server), "job", poll.placement->round);
  store.set("k", "v");
  CHECK(store.get("k", 1s) == "v");
  server.started();
  RendezvousClient client(clientOf(server), "job");
  CHECK(client.leave("host", poll.placement->round).action == Action::kClosed);
}

TEST_CASE("A server started in the background holds its port from the start", "[server]") {
  RendezvousServer first(inBackground());
  ServerOptions same;
  same.port = first.port();
  // Taken before gRPC listens (the reservation) and after (gRPC's own socket).
  REQUIRE_THROWS_AS(RendezvousServer(same), CommunicationError);
  first.started();
  REQUIRE_THROWS_AS(RendezvousServer(same), CommunicationError);
}

TEST_CASE("A store whose server went away after answering fails at once", "[server][store]") {
  auto server = std::make_unique<RendezvousServer>(inBackground());
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
