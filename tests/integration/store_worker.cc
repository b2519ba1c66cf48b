// store_worker: a worker that uses the launcher's store as the runtime does (runtime/world.cc)
// and nothing else: each rank writes its key, then reads every rank's, and prints them on one
// line. No LibTorch, so that launcher tests can run it in a second.

#include <cstdlib>
#include <iostream>
#include <string>

#include "rendezvous/client.h"

int main() {
  using namespace cxxlaunch::rendezvous;
  const char* endpoint = std::getenv("CXXLAUNCH_STORE_ENDPOINT");
  const char* prefix = std::getenv("CXXLAUNCH_STORE_PREFIX");
  if (endpoint == nullptr || prefix == nullptr) {
    std::cerr << "store_worker: no CXXLAUNCH_STORE_ENDPOINT / CXXLAUNCH_STORE_PREFIX\n";
    return 2;
  }
  const int rank = std::atoi(std::getenv("RANK"));
  const int world = std::atoi(std::getenv("WORLD_SIZE"));
  ClientOptions options;
  options.endpoint = endpoint;
  auto [run_id, round] = parseStorePrefix(prefix);
  GrpcStore store(options, run_id, round);
  store.set("rank" + std::to_string(rank), "hello from " + std::to_string(rank));
  std::string line;
  for (int r = 0; r < world; ++r) {
    line += (r > 0 ? ", " : "") + store.get("rank" + std::to_string(r), std::chrono::seconds(30));
  }
  std::cout << line << "\n";
  return 0;
}
