// The rendezvous server through real gRPC on loopback: the store, joins, fencing, auth, TLS and
// hostile input.

#include "rendezvous/server.h"

#include <arpa/inet.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <future>
#include <limits>
#include <thread>

#include "common/error.h"
#include "rendezvous/client.h"
#include "server_fixture.h"
#include "support/foreign_listener.h"
#include "support/ranks.h"
#include "support/subprocess.h"

using namespace cxxlaunch;
using namespace cxxlaunch::rendezvous;
using namespace std::chrono_literals;
using namespace cxxlaunch::rendezvous::server_fixture;

TEST_CASE("The gRPC store has c10d semantics", "[server][store]") {
  RendezvousServer server({});
  auto placed = soloRun(server, "job");
  GrpcStore store(clientFor(server), "job", placed.round);
  store.set("a", std::string("x\0y", 3));
  CHECK(store.get("a", 1s) == std::string("x\0y", 3));
  CHECK(store.add("n", 5) == 5);
  CHECK(store.add("n", -2) == 3);
  CHECK(store.compareSet("k", "old", "new") == "old");
  CHECK(store.compareSet("k", "", "v1") == "v1");
  CHECK(store.compareSet("k", "v1", "v2") == "v2");
  CHECK(store.compareSet("k", "v1", "v3") == "v2");
  CHECK(store.check({"a", "k"}));
  CHECK_FALSE(store.check({"a", "missing"}));
  store.multiSet({"m1", "m2"}, {"1", "2"});
  CHECK(store.multiGet({"m2", "m1"}, 1s) == std::vector<std::string>{"2", "1"});
  CHECK(store.numKeys() == 5);
  CHECK(store.deleteKey("a"));
  CHECK_FALSE(store.deleteKey("a"));
  REQUIRE_THROWS_AS(store.multiSet({"x"}, {}), InvalidArgument);
}

TEST_CASE("Blocking store calls wake on a write and time out naming the key", "[server][store]") {
  RendezvousServer server({});
  auto placed = soloRun(server, "job");
  GrpcStore reader(clientFor(server), "job", placed.round);
  GrpcStore writer(clientFor(server), "job", placed.round);
  auto value = std::async(std::launch::async, [&] { return reader.get("nccl_id", 20s); });
  auto waited = std::async(std::launch::async, [&] { reader.wait({"nccl_id", "other"}, 20s); });
  std::this_thread::sleep_for(50ms);
  writer.set("nccl_id", "128 bytes");
  CHECK(value.get() == "128 bytes");
  writer.set("other", "x");
  waited.get();
  REQUIRE_THROWS_AS(reader.get("never", 100ms), TimeoutError);
  REQUIRE_THROWS_WITH(reader.wait({"nccl_id", "never"}, 100ms), Catch::Contains("'never'"));
}

TEST_CASE("Runs on one server never mix", "[server][store]") {
  RendezvousServer server({});
  auto a = soloRun(server, "job-a");
  auto b = soloRun(server, "job-b");
  GrpcStore store_a(clientFor(server), "job-a", a.round);
  GrpcStore store_b(clientFor(server), "job-b", b.round);
  store_a.set("key", "a");
  store_b.set("key", "b");
  CHECK(store_a.get("key", 1s) == "a");
  CHECK(store_b.get("key", 1s) == "b");
  CHECK(store_a.numKeys() == 1);
}

TEST_CASE("Stale-round store calls are rejected and change nothing", "[server][store]") {
  RendezvousServer server({});
  RendezvousClient client(clientFor(server), "job");
  const auto s = settings(1, 1, /*max_restarts=*/1);
  auto round1 = joinUntilPlaced(client, node("a"), s);
  GrpcStore old_store(clientFor(server), "job", round1.round);
  old_store.set("id", "round1");
  CHECK(client.requestRestart("a", round1.round, {"a", 0, 1, "rank 0 exit 1"}).action ==
        Action::kRestart);
  REQUIRE_THROWS_AS(old_store.set("id", "late write"), StaleError);
  REQUIRE_THROWS_WITH(old_store.get("id", 1s), Catch::Contains("is stale"));
  auto round2 = joinUntilPlaced(client, node("a"), s);
  CHECK(round2.round == round1.round + 1);
  CHECK(round2.restart_count == 1);
  GrpcStore store(clientFor(server), "job", round2.round);
  CHECK_FALSE(store.check({"id"}));  // a fresh key space, and the late write never landed
  REQUIRE_THROWS_AS(old_store.add("n", 1), StaleError);
  CHECK(store.numKeys() == 0);
}

TEST_CASE("Nodes join one round over gRPC and get distinct ranks", "[server][rendezvous]") {
  RendezvousServer server({});
  const auto s = settings(3, 3);
  std::vector<std::future<Placement>> nodes;
  for (int i = 0; i < 3; ++i) {
    nodes.push_back(std::async(std::launch::async, [&, i] {
      RendezvousClient client(clientFor(server), "job");
      return joinUntilPlaced(client, node("node" + std::to_string(i), i + 1), s);
    }));
  }
  std::set<int> ranks, offsets;
  for (auto& f : nodes) {
    auto p = f.get();
    CHECK(p.world_size == 6);
    CHECK(p.num_nodes == 3);
    ranks.insert(p.node_rank);
    offsets.insert(p.rank_offset);
  }
  CHECK(ranks == std::set<int>{0, 1, 2});
  CHECK(offsets == std::set<int>{0, 1, 3});
  RendezvousClient observer(clientFor(server), "job");
  auto status = observer.status();
  CHECK(status.state == "running");
  CHECK(status.participants.size() == 3);
}

TEST_CASE("Keep-alives carry the workers' progress to the status", "[server][rendezvous]") {
  RendezvousServer server({});
  RendezvousClient client(clientFor(server), "job");
  const Placement p = joinUntilPlaced(client, node("a", 2), settings(1, 1));
  // With its heartbeat record's steps and step times (the straggler check's), and without.
  WorkerProgress fresh{0, 0, 4242, "sleeping", 50ms, 120, 52'000, 31'000};
  WorkerProgress stopped{1, 1, 4243, "stopped", std::nullopt};
  CHECK(client.keepAlive("a", p.round, 0ms, {fresh, stopped}).action == Action::kContinue);
  CHECK(client.keepAlive("a", p.round).action == Action::kContinue);  // no news: the report stays
  auto status = client.status();
  REQUIRE(status.participants.size() == 1);
  CHECK(status.participants[0].workers == std::vector<WorkerProgress>{fresh, stopped});
}

TEST_CASE("A lonely join reports who is missing", "[server][rendezvous]") {
  RendezvousServer server({});
  RendezvousClient client(clientFor(server), "job");
  auto poll = client.join(node("a"), settings(2, 2), 50ms);
  CHECK_FALSE(poll.placement);
  CHECK_THAT(poll.waiting_for, Catch::Contains("1 of 2 nodes joined (a)"));
  REQUIRE_THROWS_AS(client.join(node("b"), settings(2, 3), 50ms), InvalidArgument);
}

TEST_CASE("Malformed requests are rejected with INVALID_ARGUMENT", "[server][security]") {
  RendezvousServer server({});
  RendezvousClient bad_id(clientFor(server), "../etc");
  REQUIRE_THROWS_AS(bad_id.join(node("a"), settings(1, 1), 10ms), InvalidArgument);
  RendezvousClient client(clientFor(server), "job");
  REQUIRE_THROWS_WITH(client.join(node("a", 0), settings(1, 1), 10ms),
                      Catch::Contains("local world size"));
  REQUIRE_THROWS_AS(client.join(node("a"), settings(3, 2), 10ms), InvalidArgument);
  REQUIRE_THROWS_AS(client.status(), StaleError);  // the bad joins created nothing
  GrpcStore store(clientFor(server), "job", 1);
  REQUIRE_THROWS_WITH(store.get("k", -1ms), Catch::Contains("timeout must be >= 0"));
  REQUIRE_THROWS_WITH(store.get("k", 10ms), Catch::Contains("no run 'job'"));
}

TEST_CASE("A wrong or missing token is refused and changes nothing", "[server][security]") {
  ServerOptions options;
  options.token = "s3cret";
  RendezvousServer server(options);
  for (const std::string token : {"", "wrong", "s3cre"}) {
    RendezvousClient client(clientFor(server, token), "job");
    REQUIRE_THROWS_WITH(client.join(node("a"), settings(1, 1), 10ms),
                        Catch::Contains("missing or wrong job token"));
    GrpcStore store(clientFor(server, token), "job", 1);
    REQUIRE_THROWS_AS(store.set("k", "v"), InvalidArgument);
  }
  RendezvousClient good(clientFor(server, "s3cret"), "job");
  REQUIRE_THROWS_AS(good.status(), StaleError);  // no run was created by the refused calls
  auto placed = soloRun(server, "job", "s3cret");
  GrpcStore store(clientFor(server, "s3cret"), "job", placed.round);
  store.set("k", "v");
  CHECK(store.get("k", 1s) == "v");
}

TEST_CASE("Oversized messages are refused and the server keeps serving", "[server][security]") {
  ServerOptions options;
  options.max_message_bytes = 1 << 20;
  RendezvousServer server(options);
  auto placed = soloRun(server, "job");
  GrpcStore store(clientFor(server), "job", placed.round);
  REQUIRE_THROWS_AS(store.set("big", std::string(2 << 20, 'x')), LimitExceeded);
  CHECK_FALSE(store.check({"big"}));
  store.set("small", "ok");
  CHECK(store.get("small", 1s) == "ok");
}

TEST_CASE("Garbage bytes and undecodable messages do not hurt the server", "[server][security]") {
  RendezvousServer server({});
  // Raw garbage on the socket.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server.port()));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  const std::string garbage = "GET / HTTP/1.1\r\n\r\n\x00\xff\x13garbage";
  CHECK(::write(fd, garbage.data(), garbage.size()) > 0);
  ::close(fd);
  // A well-framed gRPC call whose body is not a valid protobuf message.
  auto channel = grpc::CreateChannel(server.endpoint(), grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 5s);
  const char junk[] = "\xff\xff\xff\xff\x0f";
  grpc::Slice slice(junk, sizeof(junk) - 1);
  grpc::ByteBuffer request(&slice, 1), response;
  std::promise<grpc::Status> done;
  generic.UnaryCall(&ctx, "/cxxlaunch.rdzv.Rendezvous/Join", grpc::StubOptions(), &request,
                    &response, [&](grpc::Status s) { done.set_value(s); });
  auto status = done.get_future().get();
  CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);  // as the proto promises
  CHECK_THAT(status.error_message(), Catch::Contains("not a valid message"));
  // Still serving.
  auto placed = soloRun(server, "after");
  CHECK(placed.world_size == 1);
}

TEST_CASE("A taken port is reported, not shared", "[server]") {
  RendezvousServer first({});
  ServerOptions options;
  options.port = first.port();
  REQUIRE_THROWS_AS(RendezvousServer(options), CommunicationError);
}

TEST_CASE("TLS: plaintext is refused, mutual TLS admits only certified clients",
          "[server][security]") {
  testing::TempDir dir;
  const std::string d = dir.path();
  const std::string script =
      "set -e; cd " + d +
      "; ec='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes';"
      "openssl req -x509 $ec -days 1 -subj /CN=test-ca -keyout ca.key -out ca.crt 2>/dev/null;"
      "for n in server client; do "
      "openssl req $ec -subj /CN=$n -keyout $n.key -out $n.csr 2>/dev/null;"
      "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1' > $n.ext;"
      "openssl x509 -req -in $n.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 "
      "-extfile $n.ext -out $n.crt 2>/dev/null; done";
  auto made = testing::run({"/bin/sh", "-c", script});
  REQUIRE(made.exit_code == 0);
  ServerOptions options;
  options.tls_cert_file = d + "/server.crt";
  options.tls_key_file = d + "/server.key";
  options.tls_ca_file = d + "/ca.crt";
  RendezvousServer server(options);

  ClientOptions plaintext = clientFor(server);
  plaintext.call_timeout = 1s;
  RendezvousClient plain(plaintext, "job");
  REQUIRE_THROWS_AS(plain.status(), CommunicationError);

  ClientOptions no_cert = plaintext;
  no_cert.tls_ca_file = d + "/ca.crt";
  RendezvousClient anonymous(no_cert, "job");
  REQUIRE_THROWS_AS(anonymous.status(), CommunicationError);
  // Not just "Deadline Exceeded": what to give.
  REQUIRE_THROWS_WITH(anonymous.join(node("a"), settings(1, 1), 10ms),
                      Catch::Contains("tls_cert and tls_key"));

  ClientOptions mtls = no_cert;
  mtls.tls_cert_file = d + "/client.crt";
  mtls.tls_key_file = d + "/client.key";
  mtls.call_timeout = 5s;
  RendezvousClient client(mtls, "job");
  auto placed = joinUntilPlaced(client, node("a"), settings(1, 1));
  CHECK(placed.world_size == 1);
  GrpcStore store(mtls, "job", placed.round);
  store.set("k", "v");
  CHECK(store.get("k", 1s) == "v");

  options.tls_key_file = d + "/missing.key";
  options.port = 0;
  REQUIRE_THROWS_WITH(RendezvousServer(options), Catch::Contains("missing.key"));
}

// An endpoint held by another program is named at once; the launcher's view of it, through the
// real binary: multinode_integration_test.
TEST_CASE("A join at an endpoint that is not a rendezvous server says what answered",
          "[server][security]") {
  ClientOptions o;
  o.call_timeout = 1s;
  auto join = [&](const std::string& endpoint) {
    o.endpoint = endpoint;
    RendezvousClient(o, "job").join(node("a"), settings(1, 1), 1s);
  };
  // Not HTTP/2: an error at once, with what it sent.
  testing::ForeignListener http("HTTP/1.1 200 OK\r\n\r\nhello");
  const auto start = std::chrono::steady_clock::now();
  REQUIRE_THROWS_AS(join(http.endpoint), InvalidArgument);
  REQUIRE_THROWS_WITH(
      join(http.endpoint),
      Catch::Contains(http.endpoint + " answered but is not a cxxlaunch rendezvous server") &&
          Catch::Contains("HTTP/1.1 200 OK\\r\\n\\r\\nhello"));
  CHECK(std::chrono::steady_clock::now() - start < 1s);
  // A gRPC server without our services (another program's): its UNIMPLEMENTED, at once.
  grpc::CallbackGenericService unimplemented;  // answers every call UNIMPLEMENTED
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterCallbackGenericService(&unimplemented);
  auto other = builder.BuildAndStart();
  REQUIRE(other);
  REQUIRE_THROWS_AS(join("127.0.0.1:" + std::to_string(port)), InvalidArgument);
  REQUIRE_THROWS_WITH(join("127.0.0.1:" + std::to_string(port)),
                      Catch::Contains("is not a cxxlaunch rendezvous server"));
  // Silence may be a stopped server: retried (CommunicationError), saying what was found.
  testing::ForeignListener silent("");
  try {
    join(silent.endpoint);
    FAIL("a silent listener let the join through");
  } catch (const CommunicationError& e) {
    CHECK_THAT(e.what(), Catch::Contains("accepted the connection but sent nothing back"));
  }
  // Our own server passes the probe.
  RendezvousServer server({});
  RendezvousClient client(clientFor(server), "job");
  CHECK(joinUntilPlaced(client, node("a"), settings(1, 1)).world_size == 1);
}

// The launcher that hosts the server joins it without RPC (RendezvousServer::join and the
// others); to the nodes over gRPC it is one more node.
TEST_CASE("The hosting process joins its own server directly, in one world with remote nodes",
          "[server][local]") {
  RendezvousServer server({});
  std::atomic<bool> never = false;
  std::vector<Placement> placed(2);
  testing::onRanks(2, [&](int rank) {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    if (rank == 0) {
      while (std::chrono::steady_clock::now() < deadline && placed[0].world_size == 0) {
        auto poll = server.join("mixed", node("host"), settings(2, 2), 1s, never);
        if (poll.placement) placed[0] = *poll.placement;
      }
    } else {
      RendezvousClient client(clientFor(server), "mixed");
      placed[1] = joinUntilPlaced(client, node("remote"), settings(2, 2));
    }
    RANK_REQUIRE(placed[static_cast<size_t>(rank)].world_size == 2);
  });
  CHECK(placed[0].round == placed[1].round);
  CHECK(placed[0].node_rank + placed[1].node_rank == 1);
  // The state is one: a keep-alive here sees the round the remote join completed, and the
  // last leave (over gRPC) closes the run for both.
  CHECK(server.keepAlive("mixed", "host", placed[0].round).action == Action::kContinue);
  CHECK(server.leave("mixed", "host", placed[0].round).action == Action::kContinue);
  RendezvousClient client(clientFor(server), "mixed");
  CHECK(client.leave("remote", placed[1].round).action == Action::kClosed);
  CHECK(server.keepAlive("mixed", "host", placed[0].round).action == Action::kClosed);
}

TEST_CASE("A direct join waits one poll, and a cancel or a shutdown ends it at once",
          "[server][local]") {
  RendezvousServer server({});
  std::atomic<bool> cancelled = false;
  auto poll = server.join("alone", node("host"), settings(2, 2), 50ms, cancelled);
  CHECK_FALSE(poll.placement);
  CHECK_THAT(poll.waiting_for, Catch::Contains("host"));
  // Cancelled while it waits (the poll would last the whole keep-alive interval).
  auto waiting = std::async(std::launch::async, [&] {
    return server.join("alone", node("host"), settings(2, 2), 1min, cancelled);
  });
  std::this_thread::sleep_for(50ms);
  cancelled = true;
  server.wakeJoins();
  REQUIRE_THROWS_AS(waiting.get(), CommunicationError);
  std::atomic<bool> fresh = false;
  server.shutdown();
  REQUIRE_THROWS_AS(server.join("alone", node("host"), settings(2, 2), 50ms, fresh),
                    CommunicationError);
}

TEST_CASE("Every kind of write wakes the calls waiting for its key, and only those",
          "[server][store]") {
  RendezvousServer server({});
  auto placed = soloRun(server, "job");
  GrpcStore reader(clientFor(server), "job", placed.round);
  GrpcStore writer(clientFor(server), "job", placed.round);
  auto counter = std::async(std::launch::async, [&] { return reader.get("counter", 20s); });
  auto swapped = std::async(std::launch::async, [&] { return reader.get("swapped", 20s); });
  auto both = std::async(std::launch::async, [&] { return reader.multiGet({"m1", "m2"}, 20s); });
  auto unrelated = std::async(std::launch::async, [&] { reader.wait({"never", "never"}, 2s); });
  std::this_thread::sleep_for(100ms);
  writer.add("counter", 7);
  CHECK(counter.get() == "7");
  writer.compareSet("swapped", "", "v");
  CHECK(swapped.get() == "v");
  writer.multiSet({"m1"}, {"1"});
  CHECK(both.wait_for(100ms) == std::future_status::timeout);  // m2 is still missing
  writer.deleteKey("m1");
  writer.multiSet({"m2", "m1"}, {"2", "1"});
  CHECK(both.get() == std::vector<std::string>{"1", "2"});
  // Writes of other keys answered none of it: it times out naming its key.
  REQUIRE_THROWS_WITH(unrelated.get(), Catch::Contains("'never'"));
}
