#pragma once
// Ranks as threads: runs body(rank) on `world` threads and rethrows the first failure, for tests
// of the layers above the backend (each thread has its own Fake backend and model).

#include <exception>
#include <thread>
#include <vector>

namespace cxxlaunch::runtime::testing {

template <typename Body>
void onRanks(int world, Body body) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace cxxlaunch::runtime::testing
