// cxxlaunchd's flags and the guarded file reader: bad numbers and hostile paths are one clear
// error before anything is served or read.

#include "rendezvous/daemon_flags.h"

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>

#include "common/error.h"
#include "common/file.h"
#include "support/subprocess.h"

using namespace cxxlaunch;
using namespace cxxlaunch::rendezvous;
using namespace std::chrono_literals;

TEST_CASE("readRegularFile refuses directories, FIFOs, devices and huge files at once", "[file]") {
  testing::TempDir dir;
  const std::string fifo = dir.path() + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const auto start = std::chrono::steady_clock::now();
  REQUIRE_THROWS_WITH(readRegularFile(dir.path(), "config file", 1 << 20),
                      Catch::Contains("is a directory"));
  REQUIRE_THROWS_WITH(readRegularFile(fifo, "config file", 1 << 20),
                      Catch::Contains("not a regular file"));
  REQUIRE_THROWS_WITH(readRegularFile("/dev/zero", "config file", 1 << 20),
                      Catch::Contains("not a regular file"));
  REQUIRE_THROWS_WITH(readRegularFile(dir.path() + "/none", "config file", 1 << 20),
                      Catch::Contains("cannot open"));
  CHECK(std::chrono::steady_clock::now() - start < 1s);  // nothing waited or read
  const std::string big = dir.path() + "/big";
  std::ofstream(big) << std::string(2000, 'x');
  REQUIRE_THROWS_WITH(readRegularFile(big, "token file", 1000), Catch::Contains("2000 bytes"));
  CHECK(readRegularFile(big, "token file", 2000).size() == 2000);
}

TEST_CASE("cxxlaunchd flags give the limits, with defaults, and refuse bad numbers",
          "[daemon][limits]") {
  auto defaults = parseDaemonFlags({});
  CHECK(defaults.port == 29400);
  CHECK(defaults.store_limits.max_keys == 100'000);
  CHECK(defaults.store_limits.max_bytes == 64 << 20);
  CHECK(defaults.store_limits.max_key_bytes == 4096);
  CHECK(defaults.store_limits.max_value_bytes == 16 << 20);
  CHECK(defaults.max_total_bytes == int64_t{1} << 30);
  CHECK(defaults.max_message_bytes == 64 << 20);
  CHECK(defaults.run_retention == 600s);
  auto o = parseDaemonFlags({"--store-max-keys=10", "--store-max-bytes", "1000",
                             "--store-max-key-bytes=16", "--store-max-value-bytes=100",
                             "--run-retention=2", "--port=0", "--store-max-total-bytes=5000"});
  CHECK(o.store_limits.max_keys == 10);
  CHECK(o.store_limits.max_bytes == 1000);
  CHECK(o.store_limits.max_key_bytes == 16);
  CHECK(o.store_limits.max_value_bytes == 100);
  CHECK(o.run_retention == 2s);
  CHECK(o.max_total_bytes == 5000);
  CHECK_THAT(daemonUsage(), Catch::Contains("--store-max-total-bytes"));
  for (const std::string bad :
       {"--store-max-keys=0", "--store-max-keys=-1", "--store-max-bytes=9223372036854775808",
        "--max-message-bytes=99999999999", "--run-retention=1e9", "--port=65536",
        "--store-max-key-bytes=x", "--store-max-total-bytes=0"}) {
    REQUIRE_THROWS_WITH(parseDaemonFlags({bad}), Catch::Contains("is not a whole number from"));
  }
  REQUIRE_THROWS_WITH(parseDaemonFlags({"--max-message-bytes=1000000"}),
                      Catch::Contains("cannot carry the largest value"));
  REQUIRE_THROWS_WITH(parseDaemonFlags({"--token-file=/dev/zero"}),
                      Catch::Contains("not a regular file"));
}

TEST_CASE("Serving beyond loopback without TLS is warned about", "[daemon][security]") {
  ServerOptions o;
  CHECK(exposureWarning(o).empty());
  o.host = "0.0.0.0";
  CHECK_THAT(exposureWarning(o), Catch::Contains("can join any job"));
  o.token = "t";
  CHECK_THAT(exposureWarning(o), Catch::Contains("can see the token"));
  o.tls_cert_file = "cert.pem";
  CHECK(exposureWarning(o).empty());
}
