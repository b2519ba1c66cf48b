#include "support/page_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace cxxlaunch::testing {

bool takesDirectIo(const std::string& folder) {
  struct statfs fs {};
  constexpr long kTmpfsMagic = 0x01021994;
  if (::statfs(folder.c_str(), &fs) != 0 || fs.f_type == kTmpfsMagic) return false;
  const std::string probe = folder + "/direct-probe";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  if (fd < 0) return false;
  void* block = nullptr;
  bool taken = ::posix_memalign(&block, 4096, 4096) == 0;
  if (taken) {
    std::memset(block, 0, 4096);
    taken = ::pwrite(fd, block, 4096, 0) == 4096;
    std::free(block);
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return taken;
}

size_t residentPages(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open " + path);
  const auto size = static_cast<size_t>(::lseek(fd, 0, SEEK_END));
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) throw std::runtime_error("cannot map " + path);
  std::vector<unsigned char> resident((size + page - 1) / page);
  const bool ok = ::mincore(map, size, resident.data()) == 0;
  ::munmap(map, size);
  if (!ok) throw std::runtime_error("mincore failed on " + path);
  size_t count = 0;
  for (unsigned char r : resident) count += r & 1;
  return count;
}

}  // namespace cxxlaunch::testing
