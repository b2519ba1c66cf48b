#include "common/host_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

// glibc's allocator, unless a sanitizer replaced it: then its tuning means nothing, and
// malloc_trim walks arenas glibc never set up (a crash under ASan).
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define CXXLAUNCH_GLIBC_MALLOC 1
#include <malloc.h>
#endif

namespace cxxlaunch {
namespace {

[[maybe_unused]] bool userTunesMalloc() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr) return true;
  for (const char* name : {"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

}  // namespace

bool keepFreedHostMemory() {
#if defined(CXXLAUNCH_GLIBC_MALLOC)
  if (userTunesMalloc()) return false;
  // 32 MiB is the largest mmap threshold glibc accepts on 64-bit; tensors below it come from the
  // heap and are reused. A fixed threshold also stops glibc's own adaptive one.
  constexpr int kMmapThreshold = 32 << 20;
  // Keep up to 1 GiB of freed memory at the top of the heap instead of trimming it, and grow
  // the heap 16 MiB at a time.
  constexpr int kTrimThreshold = 1 << 30;
  constexpr int kTopPad = 16 << 20;
  return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 &&
         mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1 && mallopt(M_TOP_PAD, kTopPad) == 1;
#else
  return false;
#endif
}

bool returnFreedHostMemory() {
#if defined(CXXLAUNCH_GLIBC_MALLOC)
  if (userTunesMalloc()) return false;
  constexpr int kTrimThreshold = 64 << 20;
  return mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
#else
  return false;
#endif
}

void prefaultForWriting(void* data, size_t bytes) {
#if defined(__linux__)
#if !defined(MADV_POPULATE_WRITE)
  constexpr int MADV_POPULATE_WRITE = 23;  // <linux/mman.h> of Linux 5.14, for older headers
#endif
  // madvise wants whole pages: the pages inside the range (a partial page at either end faults
  // as it is written).
  static const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(data) + page - 1) & ~(page - 1);
  const auto end = (reinterpret_cast<uintptr_t>(data) + bytes) & ~(page - 1);
  if (begin >= end) return;
  // The whole 2 MiB extents inside are asked for as transparent huge pages first, so that each
  // faults in as one page rather than 512 (where THP is "madvise" or "always"; "never" ignores
  // the advice). Extents that already hold pages keep them.
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  const auto huge_begin = (begin + kHugePage - 1) & ~(kHugePage - 1);
  const auto huge_end = end & ~(kHugePage - 1);
  if (huge_begin < huge_end) {
    madvise(reinterpret_cast<void*>(huge_begin), huge_end - huge_begin, MADV_HUGEPAGE);
  }
  // An older kernel answers EINVAL to either: nothing is lost but the speed.
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE);
#else
  (void)data;
  (void)bytes;
#endif
}

void releaseFreedHostMemory() {
#if defined(CXXLAUNCH_GLIBC_MALLOC)
  malloc_trim(0);
#endif
}

}  // namespace cxxlaunch
