// The smallest cxxlaunch worker: reads the launcher's contract and says where it stands.
//   cxxlaunch run --nproc_per_node=2 build/bin/hello_world

#include <iostream>

#include "common/error.h"
#include "runtime/env.h"

int main() {
  try {
    const auto env = cxxlaunch::runtime::readWorkerEnv();
    std::cout << "hello from rank " << env.rank << " of " << env.world_size << " (local rank "
              << env.local_rank << " of " << env.local_world_size << ", node " << env.node_rank
              << " of " << env.num_nodes << ", master " << env.master_addr << ":" << env.master_port
              << ", restart " << env.restart_count << ")" << std::endl;
    return 0;
  } catch (const cxxlaunch::Error& e) {
    std::cerr << "hello_world: " << e.what() << "\n";
    return 2;
  }
}
