#include "rendezvous/memory_store.h"

#include <catch2/catch.hpp>
#include <limits>
#include <memory>
#include <thread>

#include "common/error.h"
#include "rendezvous/prefix_store.h"
#include "support/ranks.h"

using namespace cxxlaunch;
using namespace cxxlaunch::rendezvous;
using namespace std::chrono_literals;

TEST_CASE("MemoryStore set and get", "[store]") {
  MemoryStore store;
  store.set("a", std::string("x\0y", 3));
  REQUIRE(store.get("a", 10ms) == std::string("x\0y", 3));
  store.set("a", "z");
  REQUIRE(store.get("a", 10ms) == "z");
}

TEST_CASE("MemoryStore get times out on a missing key", "[store]") {
  MemoryStore store;
  REQUIRE_THROWS_AS(store.get("missing", 20ms), TimeoutError);
  REQUIRE_THROWS_WITH(store.get("missing", 1ms), Catch::Contains("'missing'"));
}

TEST_CASE("MemoryStore get wakes when another thread sets the key", "[store]") {
  MemoryStore store;
  std::thread writer([&] {
    std::this_thread::sleep_for(20ms);
    store.set("late", "here");
  });
  REQUIRE(store.get("late", 10s) == "here");
  writer.join();
}

TEST_CASE("MemoryStore add counts atomically across threads", "[store]") {
  MemoryStore store;
  testing::onRanks(4, [&](int) {
    for (int i = 0; i < 1000; ++i) store.add("n", 1);
  });
  REQUIRE(store.add("n", 0) == 4000);
  REQUIRE(store.get("n", 1ms) == "4000");
  REQUIRE(store.add("n", -4001) == -1);
  store.set("text", "abc");
  REQUIRE_THROWS_AS(store.add("text", 1), InvalidArgument);
}

TEST_CASE("MemoryStore compareSet follows c10d", "[store]") {
  MemoryStore store;
  // Missing key with a non-empty expectation: nothing set, the expectation comes back.
  REQUIRE(store.compareSet("k", "old", "new") == "old");
  REQUIRE_FALSE(store.check({"k"}));
  // Missing key with an empty expectation: set.
  REQUIRE(store.compareSet("k", "", "v1") == "v1");
  // Matching expectation: swapped.
  REQUIRE(store.compareSet("k", "v1", "v2") == "v2");
  // Stale expectation: the current value comes back, unchanged.
  REQUIRE(store.compareSet("k", "v1", "v3") == "v2");
  REQUIRE(store.get("k", 1ms) == "v2");
}

TEST_CASE("MemoryStore wait, check, delete, numKeys, multi get/set", "[store]") {
  MemoryStore store;
  REQUIRE_THROWS_AS(store.wait({"a", "b"}, 10ms), TimeoutError);
  store.multiSet({"a", "b"}, {"1", "2"});
  store.wait({"a", "b"}, 10ms);
  REQUIRE(store.check({"a", "b"}));
  REQUIRE(store.multiGet({"b", "a"}, 10ms) == std::vector<std::string>{"2", "1"});
  REQUIRE(store.numKeys() == 2);
  REQUIRE(store.deleteKey("a"));
  REQUIRE_FALSE(store.deleteKey("a"));
  REQUIRE(store.numKeys() == 1);
  REQUIRE_THROWS_AS(store.multiSet({"a"}, {}), InvalidArgument);
}

TEST_CASE("MemoryStore add refuses to overflow and keeps the counter", "[store]") {
  MemoryStore store;
  const int64_t max = std::numeric_limits<int64_t>::max();
  REQUIRE(store.add("n", max) == max);
  REQUIRE_THROWS_WITH(store.add("n", max), Catch::Contains("would overflow"));
  REQUIRE(store.add("n", 0) == max);
  const int64_t min = std::numeric_limits<int64_t>::min();
  REQUIRE(store.add("m", min) == min);
  REQUIRE_THROWS_AS(store.add("m", -1), InvalidArgument);
}

TEST_CASE("A bounded MemoryStore refuses writes past each limit and changes nothing", "[store]") {
  MemoryStore store(
      StoreLimits{.max_keys = 3, .max_bytes = 100, .max_key_bytes = 8, .max_value_bytes = 40});
  REQUIRE_THROWS_AS(store.set("key-too-long", "v"), LimitExceeded);
  REQUIRE_THROWS_WITH(store.set("k", std::string(41, 'x')),
                      Catch::Contains("--store-max-value-bytes"));
  store.set("a", std::string(40, 'x'));
  store.set("b", std::string(40, 'x'));
  // 2 keys + 80 bytes of values = 82 bytes: 19 more bytes pass the 100-byte bound.
  REQUIRE_THROWS_WITH(store.set("c", std::string(18, 'x')), Catch::Contains("--store-max-bytes"));
  store.set("c", std::string(17, 'x'));  // exactly 100
  REQUIRE_THROWS_WITH(store.set("d", ""), Catch::Contains("--store-max-keys"));
  REQUIRE_THROWS_AS(store.multiSet({"a", "d"}, {"", ""}), LimitExceeded);
  REQUIRE(store.get("a", 1ms).size() == 40);  // the refused multiSet wrote nothing
  REQUIRE_THROWS_AS(store.compareSet("a", std::string(40, 'x'), std::string(41, 'y')),
                    LimitExceeded);
  // Overwriting and deleting give bytes back.
  store.set("a", "");
  REQUIRE(store.deleteKey("b"));
  store.set("d", std::string(40, 'x'));
  REQUIRE_THROWS_WITH(store.add("e", 1), Catch::Contains("--store-max-keys"));  // a fourth key
}

TEST_CASE("PrefixStore keeps namespaces apart", "[store]") {
  auto base = std::make_shared<MemoryStore>();
  PrefixStore round1("run/1", base), round2("run/2", base);
  round1.set("id", "one");
  round2.set("id", "two");
  REQUIRE(round1.get("id", 1ms) == "one");
  REQUIRE(round2.get("id", 1ms) == "two");
  REQUIRE(base->get("run/1/id", 1ms) == "one");
  REQUIRE(round1.add("count", 5) == 5);
  REQUIRE_FALSE(round2.check({"count"}));
  REQUIRE(round2.compareSet("id", "two", "2") == "2");
  REQUIRE(round1.multiGet({"id", "count"}, 1ms) == std::vector<std::string>{"one", "5"});
  REQUIRE(round1.deleteKey("id"));
  REQUIRE(round2.check({"id"}));
}
