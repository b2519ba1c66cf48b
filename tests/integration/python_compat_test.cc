// A stock PyTorch Python script that calls init_process_group("gloo") with env:// runs under
// `cxxlaunch run` unchanged. Exits 77 (ctest: skipped) with the reason when torch is missing.

#include <iostream>
#include <memory>

#include "support/subprocess.h"

using namespace cxxlaunch::testing;

int main() {
  auto probe = run({SYSTEM_PYTHON, "-c", "import torch"}, {}, std::chrono::seconds(120));
  if (probe.exit_code != 0) {
    std::cout << "SKIPPED: '" SYSTEM_PYTHON
                 " -c \"import torch\"' failed (install "
                 "python3-torch to run this test):\n"
              << probe.err;
    return 77;
  }
  for (int world : {2, 3}) {
    auto r = run(
        {CXXLAUNCH_BIN, "run", "--nproc_per_node", std::to_string(world), SYSTEM_PYTHON, PY_SCRIPT},
        {}, std::chrono::seconds(240));
    std::cout << r.out << r.err;
    const std::string expected = std::to_string(world * (world + 1) / 2);
    for (int rank = 0; rank < world; ++rank) {
      const std::string line = "[rank " + std::to_string(rank) + "]: rank " + std::to_string(rank) +
                               "/" + std::to_string(world) + " all_reduce ok: " + expected;
      if (r.out.find(line) == std::string::npos) {
        std::cout << "FAILED: missing line '" << line << "' (exit " << r.exit_code << ")\n";
        return 1;
      }
    }
    if (r.exit_code != 0) {
      std::cout << "FAILED: cxxlaunch exited " << r.exit_code << "\n";
      return 1;
    }
  }
  // The same script across two launchers (two nodes on loopback, one worker each).
  const std::string endpoint = "127.0.0.1:" + std::to_string(freePort());
  std::vector<std::unique_ptr<Subprocess>> nodes;
  for (int n = 0; n < 2; ++n) {
    nodes.push_back(std::make_unique<Subprocess>(std::vector<std::string>{
        CXXLAUNCH_BIN, "run", "--nnodes", "2", "--nproc_per_node", "1", "--rdzv_endpoint", endpoint,
        "--rdzv_id", "python-two-nodes", SYSTEM_PYTHON, PY_SCRIPT}));
  }
  std::string all;
  for (auto& node : nodes) {
    auto r = node->wait(std::chrono::seconds(240));
    if (!r) {
      std::cout << "FAILED: a two-node launcher did not finish\n" << node->err();
      return 1;
    }
    std::cout << r->out << r->err;
    all += r->out;
    if (r->exit_code != 0) {
      std::cout << "FAILED: two-node launcher exited " << r->exit_code << "\n";
      return 1;
    }
  }
  for (const char* line : {"rank 0/2 all_reduce ok: 3", "rank 1/2 all_reduce ok: 3"}) {
    if (all.find(line) == std::string::npos) {
      std::cout << "FAILED: missing line '" << line << "' across two nodes\n";
      return 1;
    }
  }
  std::cout << "PASSED\n";
  return 0;
}
