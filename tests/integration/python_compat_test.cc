// A stock PyTorch Python script that calls init_process_group("gloo") with env:// runs under
// `cxxlaunch run` unchanged. Exits 77 (ctest: skipped) with the reason when torch is missing.

#include <iostream>

#include "support/subprocess.h"

using namespace cxxlaunch::testing;

int main() {
  auto probe = run({SYSTEM_PYTHON, "-c", "import torch"}, {}, std::chrono::seconds(120));
  if (probe.exit_code != 0) {
    std::cout << "SKIPPED: '" SYSTEM_PYTHON " -c \"import torch\"' failed (install "
                 "python3-torch to run this test):\n"
              << probe.err;
    return 77;
  }
  for (int world : {2, 3}) {
    auto r = run({CXXLAUNCH_BIN, "run", "--nproc_per_node", std::to_string(world), SYSTEM_PYTHON,
                  PY_SCRIPT},
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
  std::cout << "PASSED\n";
  return 0;
}
