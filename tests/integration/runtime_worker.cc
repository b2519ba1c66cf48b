// runtime_worker: all-reduces in a loop over the backend the launcher's environment gives it.
//   runtime_worker [--die_rank R] [--ignore_term]
// --die_rank: that rank kills itself (SIGKILL) after two iterations. --ignore_term: ignore the
// launcher's SIGTERM, so that a survivor lives to report what its backend said about the loss.
// A survivor prints "rank N: <error>" on stderr and exits 3.

#include <signal.h>

#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "runtime/world.h"

using namespace cxxlaunch::runtime;

int main(int argc, char** argv) {
  int die_rank = -1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--die_rank") == 0 && i + 1 < argc) die_rank = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--ignore_term") == 0) ::signal(SIGTERM, SIG_IGN);
  }
  int rank = -1;
  try {
    World world = connectWorld();
    rank = world.env.rank;
    std::vector<float> data(1 << 16, 1.f);
    for (int it = 0; it < 1000; ++it) {
      if (it == 2 && rank == die_rank) ::raise(SIGKILL);
      world.backend->allreduce(data.data(), data.size(), DType::kFloat32, ReduceOp::kSum)->wait();
    }
    std::cout << "rank " << rank << ": finished" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": " << e.what() << std::endl;
    return 3;
  }
}
