// keepFreedHostMemory: freed tensor-sized blocks stay in the heap, and a user's own malloc
// tuning wins. prefaultForWriting: the whole pages of a range are there afterwards, and no byte
// changes.

#include "runtime/host_memory.h"

#include <malloc.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

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

namespace {

// Whether the kernel has MADV_POPULATE_WRITE (Linux 5.14); before it the call does nothing.
bool kernelPopulates() {
  utsname u{};
  int major = 0, minor = 0;
  return uname(&u) == 0 && std::sscanf(u.release, "%d.%d", &major, &minor) == 2 &&
         (major > 5 || (major == 5 && minor >= 14));
}

}  // namespace

TEST_CASE("prefaultForWriting faults in the whole pages of its range and changes no byte",
          "[host_memory]") {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  constexpr size_t kPages = 16;
  auto* fresh = static_cast<unsigned char*>(
      mmap(nullptr, kPages * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(fresh != MAP_FAILED);
  // From inside page 1 to inside page 9: pages 2 to 8 are whole.
  prefaultForWriting(fresh + page + 100, 8 * page);
  std::vector<unsigned char> resident(kPages);
  REQUIRE(mincore(fresh, kPages * page, resident.data()) == 0);
  // Only the pages inside are asserted: the kernel may fault in more around them (a large
  // folio), and before Linux 5.14 the call does nothing.
  if (kernelPopulates()) {
    for (size_t i = 2; i <= 8; ++i) {
      INFO("page " << i);
      CHECK((resident[i] & 1) == 1);
    }
  } else {
    WARN("kernel before Linux 5.14: the pages' residency is not checked, only their bytes");
  }
  for (size_t i = 0; i < kPages * page; ++i) {
    if (fresh[i] != 0) FAIL("byte " << i << " is " << int{fresh[i]});
  }
  // Memory already written keeps what it holds; empty and sub-page ranges are fine.
  std::vector<unsigned char> data(3 * page + 7);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 31 + 7);
  const std::vector<unsigned char> before = data;
  prefaultForWriting(data.data() + 1, data.size() - 1);
  prefaultForWriting(data.data(), 0);
  prefaultForWriting(data.data() + 5, 3);
  CHECK(data == before);
  munmap(fresh, kPages * page);
}
