#pragma once
// Ranks as threads, for multi-rank unit tests over an in-memory store or the Fake backend.
//
// onRanks runs body(rank) on `world` threads, joins them all, and rethrows in the test thread the
// first exception a rank threw (first in time: the root cause, not what it made the others
// throw). Catch2 2's assertions are not thread-safe, so a rank body never uses REQUIRE or CHECK:
// it stores what it saw in its own slot (one element per rank, not a std::vector<bool>, whose
// elements share bytes) for the test thread to check after onRanks returns, and states what must
// hold for it to go on with RANK_REQUIRE, which throws.

#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace cxxlaunch::testing {

inline void onRanks(int world, const std::function<void(int rank)>& body) {
  std::mutex mutex;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace cxxlaunch::testing

// In a rank body: throws (and so fails the test, through onRanks) when `condition` is false.
#define RANK_REQUIRE(condition)                                                         \
  do {                                                                                  \
    if (!(condition)) {                                                                 \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + \
                               ": RANK_REQUIRE(" #condition ") failed");                \
    }                                                                                   \
  } while (false)
