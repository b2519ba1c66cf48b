// keepFreedHostMemory: freed tensor-sized blocks stay in the heap, and a user's own malloc
// tuning wins. prefaultForWriting: the whole pages of a range are there afterwards (its whole
// 2 MiB extents as huge pages, where the kernel makes them), and no byte changes.

#include "common/host_memory.h"

#include <malloc.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using namespace cxxlaunch;

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

// The first bracketed word of a /sys/kernel/mm/transparent_hugepage file ("[madvise]"), or ""
// where the kernel has no THP.
std::string hugePageSetting(const std::string& file) {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/" + file);
  std::string line;
  std::getline(in, line);
  const auto open = line.find('['), close = line.find(']');
  return open == std::string::npos || close == std::string::npos
             ? ""
             : line.substr(open + 1, close - open - 1);
}

// The kB of huge pages in the mapping that holds `address` (/proc/self/smaps' AnonHugePages).
long anonHugeKb(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2) {  // a mapping's first line
      inside = begin <= at && at < end;
    } else if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      std::istringstream fields(line.substr(14));
      long kb = 0;
      fields >> kb;
      return kb;
    }
  }
  return 0;
}

}  // namespace

TEST_CASE("prefaultForWriting faults whole 2 MiB extents in as huge pages where THP is on",
          "[host_memory]") {
  constexpr size_t kHuge = size_t{2} << 20;
  // Room to place 3 extents on a 2 MiB boundary, and a range that starts and ends inside the
  // first and the last of them: only the middle one is whole.
  auto* mapped = static_cast<unsigned char*>(
      mmap(nullptr, 5 * kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(mapped != MAP_FAILED);
  auto* aligned = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(mapped) + kHuge - 1) & ~(uintptr_t{kHuge} - 1));
  prefaultForWriting(aligned + 4096, 3 * kHuge - 8192);
  const std::string enabled = hugePageSetting("enabled"), defrag = hugePageSetting("defrag");
  // A kernel that compacts memory for advised regions on the spot makes the page (defrag
  // "always", "madvise" or "defer+madvise"); with "defer" or "never" it may fall back.
  const bool made_on_the_spot =
      (enabled == "madvise" || enabled == "always") &&
      (defrag == "always" || defrag == "madvise" || defrag == "defer+madvise");
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident(kHuge / page);
  REQUIRE(mincore(aligned + kHuge, kHuge, resident.data()) == 0);
  if (kernelPopulates() && made_on_the_spot) {
    CHECK(anonHugeKb(aligned + kHuge) >= 2048);
  } else if (kernelPopulates()) {  // no huge page to be had: still every page of the extent
    INFO("transparent huge pages '" << enabled << "', defrag '" << defrag << "'");
    CHECK(std::count_if(resident.begin(), resident.end(), [](unsigned char r) {
            return (r & 1) != 0;
          }) == static_cast<long>(resident.size()));
  } else {
    WARN("kernel before Linux 5.14: prefaultForWriting does nothing there, nothing to check");
  }
  munmap(mapped, 5 * kHuge);
}

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
    WARN("kernel before Linux 5.14: prefaultForWriting does nothing there, nothing to check");
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
