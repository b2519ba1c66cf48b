// keepFreedHostMemory: freed tensor-sized blocks stay in the heap, and a user's own malloc
// tuning wins.

#include "runtime/host_memory.h"

#include <malloc.h>
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstdlib>

using namespace cxxlaunch::runtime;

TEST_CASE("A user's malloc tuning in the environment is left alone", "[host_memory]") {
  ::setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=131072", 1);
  CHECK_FALSE(keepFreedHostMemory());
  ::unsetenv("GLIBC_TUNABLES");
  ::setenv("MALLOC_MMAP_THRESHOLD_", "131072", 1);
  CHECK_FALSE(keepFreedHostMemory());
  ::unsetenv("MALLOC_MMAP_THRESHOLD_");
}

TEST_CASE("Blocks of megabytes come from the heap, not fresh mappings", "[host_memory]") {
  REQUIRE(keepFreedHostMemory());
  const size_t mapped_before = mallinfo2().hblks;
  void* block = std::malloc(size_t{8} << 20);  // glibc maps this by default (over 128 KiB)
  REQUIRE(block != nullptr);
  CHECK(mallinfo2().hblks == mapped_before);
  std::free(block);
  // Freed memory is kept for the next step, not trimmed.
  const size_t kept = mallinfo2().fordblks;
  CHECK(kept >= (size_t{8} << 20));
}
