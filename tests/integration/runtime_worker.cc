// runtime_worker: all-reduces in a loop over the backend the launcher's environment gives it.
//   runtime_worker [--die_rank R] [--stall_rank R] [--mismatch] [--ignore_term]
// --die_rank: that rank kills itself (SIGKILL) after two iterations. --stall_rank: that rank
// sleeps 30 s after two iterations (busy outside collectives). --mismatch: rank 1 all-reduces 10
// elements where the others all-reduce 11. --ignore_term: ignore the launcher's SIGTERM, so that
// a survivor lives to report what its backend said about the loss. A survivor prints
// "rank N: <error>" on stderr and exits 3.

#include <signal.h>

#include <chrono>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/world.h"

using namespace cxxlaunch::runtime;

int main(int argc, char** argv) {
  int die_rank = -1, stall_rank = -1;
  bool mismatch = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--die_rank") == 0 && i + 1 < argc) die_rank = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--stall_rank") == 0 && i + 1 < argc) {
      stall_rank = std::atoi(argv[++i]);
    }
    if (std::strcmp(argv[i], "--mismatch") == 0) mismatch = true;
    if (std::strcmp(argv[i], "--ignore_term") == 0) ::signal(SIGTERM, SIG_IGN);
  }
  int rank = -1;
  try {
    World world = connectWorld();
    rank = world.env.rank;
    std::vector<float> data(1 << 16, 1.f);
    if (mismatch) {
      const size_t count = rank == 1 ? 10 : 11;
      world.backend->allreduce(data.data(), count, DType::kFloat32, ReduceOp::kSum)->wait();
    }
    for (int it = 0; it < 1000; ++it) {
      if (it == 2 && rank == die_rank) ::raise(SIGKILL);
      if (it == 2 && rank == stall_rank) std::this_thread::sleep_for(std::chrono::seconds(30));
      world.backend->allreduce(data.data(), data.size(), DType::kFloat32, ReduceOp::kSum)->wait();
    }
    std::cout << "rank " << rank << ": finished" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": " << e.what() << std::endl;
    return 3;
  }
}
