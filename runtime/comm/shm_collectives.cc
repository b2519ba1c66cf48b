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
#include "runtime/comm/reduce.h"

namespace cxxlaunch::runtime {

// At the start of the segment, then one Call per rank; slots and the result area follow,
// page-aligned.
struct ShmCollectives::Header {
  uint64_t nonce;  // rank 0's random number: proves the others opened the same segment
  alignas(64) uint32_t arrived;  // barrier: ranks arrived in this generation
  alignas(64) uint32_t release;  // barrier generation; the futex the waiters sleep on
};

// What a rank is doing: written before its call's first barrier, compared by every rank after
// it (the second barrier keeps it in place until all have read it).
struct ShmCollectives::Call {
  uint64_t seq;  // this segment's calls, counted from 1
  Op op;
  int32_t dtype;
  uint64_t count;
  int64_t extra;  // the reduce op, or the broadcast's root

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
  ~Mapping() {
    if (base != MAP_FAILED) ::munmap(base, bytes);
  }
  void* release() { return std::exchange(base, MAP_FAILED); }
};

// Opens (or with `create`, makes and reserves) the segment `name` and maps it.
bool mapSegment(const std::string& name, size_t bytes, bool create, Mapping& mapping) {
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
    mapping.base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    mapping.bytes = bytes;
    ok = mapping.base != MAP_FAILED;
  }
  ::close(fd);
  if (!ok && create) ::shm_unlink(name.c_str());
  return ok;
}

}  // namespace

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
    std::random_device random;
    const uint64_t nonce = (static_cast<uint64_t>(random()) << 32) ^ random();
    const std::string name = "/" + std::string(env::kShmNamePrefix) + std::to_string(::getpid()) +
                             "-" + std::to_string(nonce % 1000000007);
    std::string published;  // empty: no segment, everybody stays on TCP
    if (mapSegment(name, bytes, /*create=*/true, mapping)) {
      auto* header = new (mapping.base) Header{};
      header->nonce = nonce;
      published = name + " " + std::to_string(nonce);
    }
    // Once everybody answered (or on any error), the name goes: the mappings keep the memory.
    struct Unlink {
      std::string name;
      ~Unlink() {
        if (!name.empty()) ::shm_unlink(name.c_str());
      }
    } unlink_when_done{published.empty() ? std::string() : name};
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
void ShmCollectives::enter(Op op, DType dtype, size_t count, int64_t extra) {
  const Call mine{++calls_, op, static_cast<int32_t>(dtype), count, extra};
  calls()[rank_] = mine;
  barrier();
  bool same = true;
  for (int r = 0; r < size_; ++r) same = same && calls()[r] == mine;
  if (same) return;
  std::string each;
  for (int r = 0; r < size_; ++r) {
    const Call& c = calls()[r];
    static const char* const names[] = {"allreduce", "reduceScatter", "allGather", "broadcast",
                                        "barrier"};
    const auto op_index = static_cast<uint32_t>(c.op);  // another process wrote it
    each += "\n  rank " + std::to_string(r) + ": shared-memory call #" + std::to_string(c.seq) +
            " " + (op_index < 5 ? names[op_index] : "?");
    if (c.op != Op::kBarrier) {
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

void ShmCollectives::allreduce(void* data, size_t count, DType dtype, ReduceOp op) {
  const size_t elem = dtypeSize(dtype);
  const size_t chunk = slot_bytes_ / elem;
  auto* bytes = static_cast<char*>(data);
  for (size_t done = 0; done < count; done += chunk) {
    const size_t n = std::min(chunk, count - done);
    std::memcpy(slot(rank_), bytes + done * elem, n * elem);
    if (done == 0) {
      enter(Op::kAllreduce, dtype, count, static_cast<int64_t>(op));
    } else {
      barrier();
    }
    // This rank's share of the chunk, reduced from every slot in rank order.
    const size_t lo = n * static_cast<size_t>(rank_) / static_cast<size_t>(size_);
    const size_t hi = n * static_cast<size_t>(rank_ + 1) / static_cast<size_t>(size_);
    char* mine = result() + lo * elem;
    std::memcpy(mine, slot(0) + lo * elem, (hi - lo) * elem);
    for (int r = 1; r < size_; ++r) reduceInto(mine, slot(r) + lo * elem, hi - lo, dtype, op);
    if (op == ReduceOp::kAvg) divideBy(mine, hi - lo, dtype, size_);
    barrier();
    // Nobody writes the result again before everyone has passed the next chunk's first barrier.
    std::memcpy(bytes + done * elem, result(), n * elem);
  }
}

void ShmCollectives::reduceScatter(const void* input, void* output, size_t count, DType dtype,
                                   ReduceOp op) {
  const size_t elem = dtypeSize(dtype);
  const auto size = static_cast<size_t>(size_);
  const size_t piece = std::max<size_t>(1, slot_bytes_ / elem / size);  // of each rank's chunk
  const auto* in = static_cast<const char*>(input);
  auto* out = static_cast<char*>(output);
  for (size_t done = 0; done < count; done += piece) {
    const size_t n = std::min(piece, count - done);
    // Slot layout: world_size rows of `n` elements, row r for rank r's output.
    for (size_t r = 0; r < size; ++r) {
      std::memcpy(slot(rank_) + r * n * elem, in + (r * count + done) * elem, n * elem);
    }
    if (done == 0) {
      enter(Op::kReduceScatter, dtype, count, static_cast<int64_t>(op));
    } else {
      barrier();
    }
    char* mine = out + done * elem;
    const size_t row = static_cast<size_t>(rank_) * n * elem;
    std::memcpy(mine, slot(0) + row, n * elem);
    for (int r = 1; r < size_; ++r) reduceInto(mine, slot(r) + row, n, dtype, op);
    if (op == ReduceOp::kAvg) divideBy(mine, n, dtype, size_);
    barrier();  // the slots are read: they may be filled again
  }
}

void ShmCollectives::allGather(const void* input, void* output, size_t count, DType dtype) {
  const size_t elem = dtypeSize(dtype);
  const size_t chunk = slot_bytes_ / elem;
  const auto* in = static_cast<const char*>(input);
  auto* out = static_cast<char*>(output);
  for (size_t done = 0; done < count; done += chunk) {
    const size_t n = std::min(chunk, count - done);
    std::memcpy(slot(rank_), in + done * elem, n * elem);
    if (done == 0) {
      enter(Op::kAllGather, dtype, count, -1);
    } else {
      barrier();
    }
    for (int r = 0; r < size_; ++r) {
      std::memcpy(out + (static_cast<size_t>(r) * count + done) * elem, slot(r), n * elem);
    }
    barrier();  // the slots are read: they may be filled again
  }
}

void ShmCollectives::broadcast(void* data, size_t count, DType dtype, int root) {
  // One writer: the segment (every slot and the result area, end to end) in two halves, so that
  // the root fills one while the others copy the other out. Between two barriers the root writes
  // chunk k and the others read chunk k - 1; half k % 2 was last read before the previous one.
  const size_t elem = dtypeSize(dtype);
  const size_t chunk = static_cast<size_t>(size_ + 1) * slot_bytes_ / 2 / elem;
  auto* bytes = static_cast<char*>(data);
  auto half = [&](size_t k) { return slot(0) + (k % 2) * chunk * elem; };
  const size_t chunks = (count + chunk - 1) / chunk;
  for (size_t k = 0; k <= chunks; ++k) {
    if (rank_ == root && k < chunks) {
      std::memcpy(half(k), bytes + k * chunk * elem, std::min(chunk, count - k * chunk) * elem);
    } else if (rank_ != root && k > 0) {
      const size_t done = (k - 1) * chunk;
      std::memcpy(bytes + done * elem, half(k - 1), std::min(chunk, count - done) * elem);
    }
    if (k == 0 && chunks > 0) {
      enter(Op::kBroadcast, dtype, count, root);
    } else if (chunks > 0) {
      barrier();
    }
  }
}

void ShmCollectives::barrierCall() {
  enter(Op::kBarrier, DType::kUInt8, 0, -1);
  barrier();  // the calls are read: they may be written again
}

}  // namespace cxxlaunch::runtime
