#include "runtime/comm/shm_collectives.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <new>
#include <random>
#include <utility>

#include "common/env_names.h"
#include "common/error.h"

namespace cxxlaunch::runtime {

// At the start of the segment, then one Call per rank; slots and the result area follow,
// page-aligned.
struct ShmCollectives::Header {
  uint64_t nonce;  // rank 0's random number: proves the others opened the same segment
  alignas(64) uint32_t arrived;  // barrier: ranks arrived in this generation
  alignas(64) uint32_t release;  // barrier generation; the futex the waiters sleep on
  char region_name[64];          // registerBuffer: the new segment's name (rank 0's), or empty
};

// What a rank is doing: written before its call's first barrier, compared by every rank after
// it (the second barrier keeps it in place until all have read it).
struct ShmCollectives::Call {
  uint64_t seq;  // this segment's calls, counted from 1
  Op op;
  int32_t dtype;
  uint64_t count;
  int64_t extra;   // the reduce op, or the broadcast's root
  Location where;  // this rank's buffer
  // registerBuffer: whether this rank mapped the new segment. Written after the call's first
  // barrier, so that a rank still reading it is never overtaken by the writer's next call.
  int32_t mapped;

  bool operator==(const Call& o) const {
    return seq == o.seq && op == o.op && dtype == o.dtype && count == o.count && extra == o.extra;
  }
};

namespace {

constexpr size_t kPage = 4096;
// How long a rank spins before it sleeps: about what a peer needs to copy a chunk in. Short,
// because the waiting thread may share its core with the trainer's (DDP overlaps backward).
constexpr auto kSpin = std::chrono::microseconds(30);
// How often a sleeping rank looks whether its peers are still alive.
constexpr auto kPeerCheck = std::chrono::milliseconds(50);

size_t defaultSlotBytes(int size) {
  // About 32 MiB for the whole segment, 256 KiB to 4 MiB a rank: large chunks keep the two
  // barriers per chunk rare, a small segment fits a container's default 64 MiB /dev/shm.
  const size_t share = (size_t{32} << 20) / static_cast<size_t>(size + 1);
  return std::clamp(share / kPage * kPage, size_t{256} << 10, size_t{4} << 20);
}

size_t segmentBytes(int size, size_t slot_bytes) {
  return ShmCollectives::headerBytes(size) + (static_cast<size_t>(size) + 1) * slot_bytes;
}

long futex(uint32_t* word, int op, uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  return ::syscall(SYS_futex, word, op, value, timeout, nullptr, 0);
}

void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

int pidfdOpen(int pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

std::string readFirstLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

struct Mapping {
  void* base = MAP_FAILED;
  size_t bytes = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (base != MAP_FAILED) ::munmap(base, bytes);
  }
  void* release() { return std::exchange(base, MAP_FAILED); }
};

// Opens (or with `create`, makes and reserves) the segment `name` and maps it; with `populate`
// its pages are mapped now, not faulted in one by one by the first collective.
bool mapSegment(const std::string& name, size_t bytes, bool create, Mapping& mapping,
                bool populate = false) {
  const int fd = create ? ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600)
                        : ::shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return false;
  bool ok = true;
  if (create) {
    // Reserve the pages now: a full /dev/shm then fails here, not as SIGBUS mid-collective.
    ok = ::ftruncate(fd, static_cast<off_t>(bytes)) == 0 &&
         ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)) == 0;
  } else {
    struct stat st {};
    ok = ::fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == bytes;
  }
  if (ok) {
    mapping.base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                          MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
    mapping.bytes = bytes;
    ok = mapping.base != MAP_FAILED;
  }
  ::close(fd);
  if (!ok && create) ::shm_unlink(name.c_str());
  return ok;
}

uint64_t randomNonce() {
  std::random_device random;
  return (static_cast<uint64_t>(random()) << 32) ^ random();
}

// "/cxxlaunch-<pid>-...": the prefix the launcher removes after its worker `pid` failed.
std::string segmentName(const std::string& what, uint64_t nonce) {
  return "/" + std::string(env::kShmNamePrefix) + std::to_string(::getpid()) + "-" + what +
         std::to_string(nonce % 1000000007);
}

// Removes a segment's name when it goes out of scope (the mappings keep the memory).
struct Unlink {
  std::string name;
  ~Unlink() {
    if (!name.empty()) ::shm_unlink(name.c_str());
  }
};

}  // namespace

// A segment registerBuffer made: `part` bytes for each rank, in rank order.
struct ShmCollectives::Region {
  Mapping mapping;
  size_t part = 0;
  char* of(int rank) const { return static_cast<char*>(mapping.base) + rank * part; }
};

std::string ShmCollectives::thisHostKey() {
  // Same boot: same machine (hostnames repeat across containers and clusters). Same PID
  // namespace: the peers' pids mean what they say.
  struct stat ns {};
  const bool have_ns = ::stat("/proc/self/ns/pid", &ns) == 0;
  return readFirstLine("/proc/sys/kernel/random/boot_id") + "/" +
         (have_ns ? std::to_string(ns.st_ino) : std::string("?"));
}

std::unique_ptr<ShmCollectives> ShmCollectives::connect(rendezvous::Store& store,
                                                        const ShmOptions& options) {
  const int rank = options.rank, size = options.world_size;
  if (size < 2) return nullptr;
  const auto timeout = options.timeout;
  const std::string key = !options.enabled           ? "declined by rank " + std::to_string(rank)
                          : options.host_key.empty() ? thisHostKey()
                                                     : options.host_key;
  const size_t slot_bytes = options.slot_bytes ? options.slot_bytes : defaultSlotBytes(size);
  const size_t bytes = segmentBytes(size, slot_bytes);

  // 1. Are we all on one host? Every rank reads every key, so all decide alike.
  std::vector<std::string> host_keys, ok_keys;
  for (int r = 0; r < size; ++r) {
    host_keys.push_back("host/" + std::to_string(r));
    ok_keys.push_back("ok/" + std::to_string(r));
  }
  store.set(host_keys[static_cast<size_t>(rank)], key);
  for (const auto& other : store.multiGet(host_keys, timeout)) {
    if (other != key) return nullptr;
  }

  // 3. (below) Every rank says whether it mapped the segment (its pid) or not ("-"): one "-"
  // and every rank stays on TCP.
  Mapping mapping;
  auto agree = [&](const std::string& mine) -> std::unique_ptr<ShmCollectives> {
    store.set(ok_keys[static_cast<size_t>(rank)], mine);
    std::vector<int> pids;
    for (const auto& answer : store.multiGet(ok_keys, timeout)) {
      if (answer == "-") return nullptr;
      pids.push_back(std::stoi(answer));
    }
    return std::unique_ptr<ShmCollectives>(
        new ShmCollectives(options, mapping.release(), bytes, std::move(pids)));
  };

  // 2. Rank 0 makes the segment; the others open it and check its nonce.
  if (rank == 0) {
    const uint64_t nonce = randomNonce();
    const std::string name = segmentName("", nonce);
    std::string published;  // empty: no segment, everybody stays on TCP
    if (mapSegment(name, bytes, /*create=*/true, mapping)) {
      auto* header = new (mapping.base) Header{};
      header->nonce = nonce;
      published = name + " " + std::to_string(nonce);
    }
    // Once everybody answered (or on any error), the name goes: the mappings keep the memory.
    Unlink unlink_when_done{published.empty() ? std::string() : name};
    store.set("segment", published);
    if (published.empty()) return nullptr;
    return agree(std::to_string(::getpid()));
  }
  const std::string published = store.get("segment", timeout);
  const auto space = published.find(' ');
  if (space == std::string::npos) return nullptr;  // rank 0 could not make it
  const bool ok =
      mapSegment(published.substr(0, space), bytes, /*create=*/false, mapping) &&
      std::to_string(static_cast<Header*>(mapping.base)->nonce) == published.substr(space + 1);
  return agree(ok ? std::to_string(::getpid()) : "-");
}

ShmCollectives::ShmCollectives(const ShmOptions& options, void* base, size_t bytes,
                               std::vector<int> pids)
    : rank_(options.rank),
      size_(options.world_size),
      timeout_(options.timeout),
      slot_bytes_(options.slot_bytes ? options.slot_bytes : defaultSlotBytes(options.world_size)),
      base_(base),
      bytes_(bytes),
      header_(static_cast<Header*>(base)),
      pids_(std::move(pids)) {
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) pidfds_.push_back(pidfdOpen(pids_[static_cast<size_t>(r)]));
  }
}

ShmCollectives::~ShmCollectives() {
  for (int fd : pidfds_) {
    if (fd >= 0) ::close(fd);
  }
  ::munmap(base_, bytes_);
}

size_t ShmCollectives::headerBytes(int size) {
  const size_t bytes = sizeof(Header) + static_cast<size_t>(size) * sizeof(Call);
  return (bytes + kPage - 1) / kPage * kPage;
}

ShmCollectives::Call* ShmCollectives::calls() const {
  return reinterpret_cast<Call*>(static_cast<char*>(base_) + sizeof(Header));
}

char* ShmCollectives::slot(int rank) const {
  return static_cast<char*>(base_) + headerBytes(size_) + static_cast<size_t>(rank) * slot_bytes_;
}

// The first barrier of a call, and the check that every rank is in the same call: a mismatch
// (another operation, dtype or count: a collective called on some ranks only, or with other
// sizes) fails on every rank at once, naming each rank's call, instead of hanging or mixing
// unrelated data. A few words per call: no measurable cost.
void ShmCollectives::enter(Op op, DType dtype, size_t count, int64_t extra, Location where) {
  const Call mine{++calls_, op, static_cast<int32_t>(dtype), count, extra, where, 0};
  Call& published = calls()[rank_];
  published.seq = mine.seq;  // not `mapped`: a peer may still read the last registration's
  published.op = op;
  published.dtype = mine.dtype;
  published.count = count;
  published.extra = extra;
  published.where = where;
  barrier();
  bool same = true;
  for (int r = 0; r < size_; ++r) same = same && calls()[r] == mine;
  if (same) return;
  std::string each;
  for (int r = 0; r < size_; ++r) {
    const Call& c = calls()[r];
    static const char* const names[] = {"allreduce", "reduceScatter", "allGather",
                                        "broadcast", "barrier",       "registerBuffer"};
    const auto op_index = static_cast<uint32_t>(c.op);  // another process wrote it
    each += "\n  rank " + std::to_string(r) + ": shared-memory call #" + std::to_string(c.seq) +
            " " + (op_index < 6 ? names[op_index] : "?");
    if (c.op == Op::kRegister) {
      each += " of " + std::to_string(c.count) + " bytes";
    } else if (c.op != Op::kBarrier) {
      each += std::string(" ") + dtypeName(static_cast<DType>(c.dtype)) + " x" +
              std::to_string(c.count) +
              (c.op == Op::kBroadcast ? " from rank " + std::to_string(c.extra) : "");
    }
  }
  throw CommunicationError(
      "the ranks called different collectives (a collective called on some ranks only, or with "
      "other sizes):" +
      each);
}

char* ShmCollectives::result() const { return slot(size_); }

void ShmCollectives::checkPeers() const {
  size_t fd_index = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const int fd = pidfds_[fd_index++];
    const int pid = pids_[static_cast<size_t>(r)];
    bool gone = false;
    if (fd >= 0) {
      pollfd p{fd, POLLIN, 0};
      gone = ::poll(&p, 1, 0) == 1;  // a pidfd turns readable when its process exits
    } else {
      gone = ::kill(pid, 0) != 0 && errno == ESRCH;
    }
    if (gone) {
      throw PeerLost("rank " + std::to_string(r) + " (pid " + std::to_string(pid) +
                     ") on this host exited in the middle of a collective (a peer closed its "
                     "connection: did it die?)");
    }
  }
}

// A central barrier: the last rank to arrive opens the next generation and wakes the sleepers.
void ShmCollectives::barrier() {
  std::atomic_ref<uint32_t> arrived(header_->arrived);
  std::atomic_ref<uint32_t> release(header_->release);
  const uint32_t generation = release.load(std::memory_order_acquire);
  if (arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(size_)) {
    arrived.store(0, std::memory_order_relaxed);
    release.fetch_add(1, std::memory_order_release);
    futex(&header_->release, FUTEX_WAKE, INT_MAX, nullptr);
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < kSpin) {
    for (int i = 0; i < 64; ++i) {
      if (release.load(std::memory_order_acquire) != generation) return;
      cpuRelax();
    }
  }
  const auto deadline = start + timeout_;
  const timespec slice{0, std::chrono::nanoseconds(kPeerCheck).count()};
  while (release.load(std::memory_order_acquire) == generation) {
    futex(&header_->release, FUTEX_WAIT, generation, &slice);
    if (release.load(std::memory_order_acquire) != generation) return;
    checkPeers();
    if (std::chrono::steady_clock::now() > deadline) {
      throw TimeoutError("shared memory: ranks did not all arrive within " +
                         std::to_string(timeout_.count()) + " ms");
    }
  }
}

ShmCollectives::Location ShmCollectives::locate(const void* data, size_t bytes) const {
  const auto* p = static_cast<const char*>(data);
  for (size_t i = 0; i < regions_.size(); ++i) {
    const char* mine = regions_[i]->of(rank_);
    if (p >= mine && p + bytes <= mine + regions_[i]->part) {
      return {static_cast<int64_t>(i), static_cast<uint64_t>(p - mine)};
    }
  }
  return {};
}

bool ShmCollectives::isRegistered(const void* data, size_t bytes) const {
  return locate(data, bytes).region >= 0;
}

std::vector<char*> ShmCollectives::peerBuffers() const {
  std::vector<char*> buffers;
  for (int r = 0; r < size_; ++r) {
    const Location where = calls()[r].where;
    const bool known = where.region >= 0 && static_cast<size_t>(where.region) < regions_.size();
    buffers.push_back(known ? regions_[static_cast<size_t>(where.region)]->of(r) + where.offset
                            : nullptr);
  }
  return buffers;
}

std::shared_ptr<void> ShmCollectives::registerBuffer(size_t bytes) {
  const size_t part = (std::max<size_t>(bytes, 1) + kPage - 1) / kPage * kPage;
  enter(Op::kRegister, DType::kUInt8, bytes, static_cast<int64_t>(regions_.size()), Location{});
  auto region = std::make_shared<Region>();
  region->part = part;
  const size_t total = part * static_cast<size_t>(size_);
  // Rank 0 makes the segment and names it in the header; the others map it once named.
  Unlink unlink_when_done;
  bool ok = false;
  if (rank_ == 0) {
    const std::string name = segmentName("buffer-", randomNonce());
    ok = name.size() < sizeof(header_->region_name) &&
         mapSegment(name, total, /*create=*/true, region->mapping, /*populate=*/true);
    if (ok) unlink_when_done.name = name;
    std::strncpy(header_->region_name, ok ? name.c_str() : "", sizeof(header_->region_name));
  }
  barrier();
  if (rank_ != 0) {
    const std::string name(header_->region_name,
                           strnlen(header_->region_name, sizeof(header_->region_name)));
    ok = !name.empty() &&
         mapSegment(name, total, /*create=*/false, region->mapping, /*populate=*/true);
  }
  calls()[rank_].mapped = ok ? 1 : 0;
  barrier();  // every rank has mapped it or given up: rank 0 unlinks it on return
  for (int r = 0; r < size_; ++r) ok = ok && calls()[r].mapped == 1;
  if (!ok) return nullptr;
  regions_.push_back(region);
  return std::shared_ptr<void>(region->of(rank_), [region](void*) {});
}

}  // namespace cxxlaunch::runtime
