// Shared-memory collectives with ranks as threads, each with its own mapping of the segment:
// closed-form results across chunk boundaries, bitwise agreement between ranks, the fallback
// when ranks are not on one host, nothing left in /dev/shm, and a timeout instead of a hang.
// (A peer process that dies is tested with real processes in runtime_integration_test.)

#include "runtime/comm/shm_collectives.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "common/error.h"
#include "rendezvous/memory_store.h"
#include "runtime/comm/reduce.h"
#include "support/mappings.h"
#include "support/ranks.h"

using namespace cxxlaunch;
using namespace cxxlaunch::runtime;
using cxxlaunch::testing::onRanks;

namespace {

constexpr size_t kSlotBytes = 4096;  // small, so that a few thousand elements span many chunks

ShmOptions options(int rank, int world) {
  ShmOptions o;
  o.rank = rank;
  o.world_size = world;
  o.slot_bytes = kSlotBytes;
  o.timeout = std::chrono::seconds(10);
  return o;
}

std::vector<std::string> ourSegments() {
  std::vector<std::string> found;
  const std::string mine = "cxxlaunch-" + std::to_string(::getpid()) + "-";
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    if (entry.path().filename().string().starts_with(mine)) found.push_back(entry.path());
  }
  return found;
}

}  // namespace

TEST_CASE("Shared-memory allreduce and reduce-scatter are exact across chunks", "[shm]") {
  for (int n = 2; n <= 4; ++n) {
    INFO("world " << n);
    rendezvous::MemoryStore store;
    const size_t count = 3001;  // floats: several 1024-element chunks and an uneven last one
    std::vector<std::vector<float>> sums(n), avgs(n), maxes(n), scattered(n);
    std::vector<std::vector<int32_t>> ints(n);
    std::vector<std::vector<uint16_t>> bf16(n);
    onRanks(n, [&](int r) {
      auto shm = ShmCollectives::connect(store, options(r, n));
      RANK_REQUIRE(shm != nullptr);
      sums[r].resize(count);
      for (size_t i = 0; i < count; ++i) sums[r][i] = static_cast<float>(r + 1) * i;
      shm->allreduce(sums[r].data(), count, DType::kFloat32, ReduceOp::kSum);
      avgs[r].assign(count, static_cast<float>(2 * (r + 1)));
      shm->allreduce(avgs[r].data(), count, DType::kFloat32, ReduceOp::kAvg);
      maxes[r].assign(count, static_cast<float>(r));
      shm->allreduce(maxes[r].data(), count, DType::kFloat32, ReduceOp::kMax);
      ints[r].assign(count, r - 1);
      shm->allreduce(ints[r].data(), count, DType::kInt32, ReduceOp::kMin);
      bf16[r].assign(count, floatToBfloat16(static_cast<float>(r + 1)));
      shm->allreduce(bf16[r].data(), count, DType::kBFloat16, ReduceOp::kSum);
      std::vector<float> chunks(count * static_cast<size_t>(n));
      for (size_t i = 0; i < chunks.size(); ++i) chunks[i] = static_cast<float>(i);
      scattered[r].resize(count);
      shm->reduceScatter(chunks.data(), scattered[r].data(), count, DType::kFloat32,
                         ReduceOp::kSum);
    });
    const float triangle = static_cast<float>(n * (n + 1) / 2);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) {
        CHECK(sums[r][i] == triangle * i);
        CHECK(avgs[r][i] == static_cast<float>(n + 1));
        CHECK(maxes[r][i] == static_cast<float>(n - 1));
        CHECK(ints[r][i] == -1);
        CHECK(bfloat16ToFloat(bf16[r][i]) == triangle);
        CHECK(scattered[r][i] == static_cast<float>(n) * (r * count + i));
      }
    }
  }
}

TEST_CASE("Shared-memory all-gather is exact across chunks, in place too", "[shm]") {
  for (int n = 2; n <= 4; ++n) {
    INFO("world " << n);
    rendezvous::MemoryStore store;
    const size_t count = 2501;  // several 1024-float chunks and an uneven last one
    std::vector<std::vector<float>> gathered(n), in_place(n);
    onRanks(n, [&](int r) {
      auto shm = ShmCollectives::connect(store, options(r, n));
      RANK_REQUIRE(shm != nullptr);
      std::vector<float> mine(count);
      for (size_t i = 0; i < count; ++i) mine[i] = static_cast<float>(r * 10000 + i);
      gathered[r].resize(count * static_cast<size_t>(n));
      shm->allGather(mine.data(), gathered[r].data(), count, DType::kFloat32);
      // The input is this rank's place in the output, as ZeRO gathers an updated shard.
      in_place[r].assign(count * static_cast<size_t>(n), -1.f);
      std::copy(mine.begin(), mine.end(), in_place[r].begin() + static_cast<ptrdiff_t>(r * count));
      shm->allGather(in_place[r].data() + r * count, in_place[r].data(), count, DType::kFloat32);
    });
    for (int r = 0; r < n; ++r) {
      for (int from = 0; from < n; ++from) {
        for (size_t i = 0; i < count; ++i) {
          const float expected = static_cast<float>(from * 10000 + i);
          CHECK(gathered[r][from * count + i] == expected);
          CHECK(in_place[r][from * count + i] == expected);
        }
      }
    }
  }
}

TEST_CASE("Shared-memory broadcast carries the root's bytes across chunks, from any root",
          "[shm]") {
  for (int n = 2; n <= 4; ++n) {
    rendezvous::MemoryStore store;
    // Many chunks (half the segment: (n + 1) slots of 1024 floats) and an uneven last one.
    const size_t count = static_cast<size_t>(n + 1) * 1024 * 3 + 7;
    std::vector<std::vector<std::vector<uint32_t>>> got(n, std::vector<std::vector<uint32_t>>(n));
    onRanks(n, [&](int r) {
      auto shm = ShmCollectives::connect(store, options(r, n));
      RANK_REQUIRE(shm != nullptr);
      for (int root = 0; root < n; ++root) {
        auto& data = got[r][root];
        data.assign(count, 0xffffffffu);  // every receiver's old contents differ from the root's
        if (r == root) {
          // Bit patterns a float sum would change: -0, NaN payloads, denormals.
          for (size_t i = 0; i < count; ++i) data[i] = static_cast<uint32_t>(i * 2654435761u);
        }
        shm->broadcast(data.data(), count, DType::kFloat32, root);
      }
    });
    for (int root = 0; root < n; ++root) {
      for (int r = 0; r < n; ++r) {
        INFO("world " << n << " root " << root << " rank " << r);
        CHECK(got[r][root] == got[root][root]);
      }
      CHECK(got[root][root][5] == static_cast<uint32_t>(5 * 2654435761u));
    }
  }
}

TEST_CASE("Every rank gets bitwise the same sum of inexact floats", "[shm]") {
  const int n = 3;
  rendezvous::MemoryStore store;
  const size_t count = 5000;
  std::vector<std::vector<float>> data(n);
  onRanks(n, [&](int r) {
    std::mt19937 random(static_cast<unsigned>(r));
    std::normal_distribution<float> normal;
    data[r].resize(count);
    for (auto& x : data[r]) x = normal(random) * 1e3f;
    auto shm = ShmCollectives::connect(store, options(r, n));
    RANK_REQUIRE(shm != nullptr);
    shm->allreduce(data[r].data(), count, DType::kFloat32, ReduceOp::kSum);
  });
  CHECK(data[1] == data[0]);
  CHECK(data[2] == data[0]);
}

TEST_CASE("The segment is gone from /dev/shm once every rank holds it", "[shm]") {
  rendezvous::MemoryStore store;
  std::vector<std::unique_ptr<ShmCollectives>> held(2);
  onRanks(2, [&](int r) { held[r] = ShmCollectives::connect(store, options(r, 2)); });
  REQUIRE(held[0] != nullptr);
  REQUIRE(held[1] != nullptr);
  CHECK(ourSegments().empty());
  std::vector<float> x(10, 1.0f), y(10, 2.0f);
  onRanks(2, [&](int r) {
    held[r]->allreduce(r == 0 ? x.data() : y.data(), 10, DType::kFloat32, ReduceOp::kSum);
  });
  CHECK(x == std::vector<float>(10, 3.0f));
  CHECK(y == x);
}

TEST_CASE("Ranks on different hosts all fall back to TCP", "[shm]") {
  rendezvous::MemoryStore store;
  std::vector<int> connected(3, -1);
  onRanks(3, [&](int r) {
    auto o = options(r, 3);
    o.host_key = r == 2 ? "another-host" : "this-host";
    connected[r] = ShmCollectives::connect(store, o) != nullptr;
  });
  CHECK(connected == std::vector<int>{0, 0, 0});
  CHECK(ourSegments().empty());
}

TEST_CASE("One rank with shared memory off keeps every rank on TCP", "[shm]") {
  rendezvous::MemoryStore store;
  std::vector<int> connected(2, -1);
  onRanks(2, [&](int r) {
    auto o = options(r, 2);
    o.enabled = r == 0;
    connected[r] = ShmCollectives::connect(store, o) != nullptr;
  });
  CHECK(connected == std::vector<int>{0, 0});
}

TEST_CASE("A world of one needs no segment", "[shm]") {
  rendezvous::MemoryStore store;
  CHECK(ShmCollectives::connect(store, options(0, 1)) == nullptr);
}

TEST_CASE("A rank that never arrives ends the others' wait with a timeout", "[shm]") {
  rendezvous::MemoryStore store;
  std::vector<std::unique_ptr<ShmCollectives>> held(2);
  onRanks(2, [&](int r) {
    auto o = options(r, 2);
    o.timeout = std::chrono::milliseconds(300);
    held[r] = ShmCollectives::connect(store, o);
  });
  REQUIRE(held[0] != nullptr);
  std::vector<float> x(10, 1.0f);
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(held[0]->allreduce(x.data(), x.size(), DType::kFloat32, ReduceOp::kSum),
                  TimeoutError);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}

TEST_CASE("Ranks in different calls all fail at once, naming each rank's call", "[shm]") {
  // A collective on some ranks only (rank 0 all-reduces where the others are at a barrier), and
  // one with other sizes: without the check the first mixes unrelated data or hangs, the second
  // reduces garbage.
  struct Case {
    std::string name, rank0, others;
  };
  for (const Case& c :
       {Case{"some ranks only", "#2 allreduce int32 x1", "#2 barrier"},
        Case{"other sizes", "#2 allGather float32 x7", "#2 allGather float32 x8"}}) {
    INFO(c.name);
    for (int n = 2; n <= 3; ++n) {
      rendezvous::MemoryStore store;
      std::vector<std::string> errors(static_cast<size_t>(n));
      onRanks(n, [&](int r) {
        auto shm = ShmCollectives::connect(store, options(r, n));
        RANK_REQUIRE(shm != nullptr);
        shm->barrierCall();  // #1: the same everywhere
        std::vector<float> in(8, 1.f), out(8 * static_cast<size_t>(n));
        int32_t flag = 1;
        try {
          if (c.name == "other sizes") {
            shm->allGather(in.data(), out.data(), r == 0 ? 7 : 8, DType::kFloat32);
          } else if (r == 0) {
            shm->allreduce(&flag, 1, DType::kInt32, ReduceOp::kMin);
          } else {
            shm->barrierCall();
          }
        } catch (const CommunicationError& e) {
          errors[static_cast<size_t>(r)] = e.what();
        }
      });
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r << ": " << errors[static_cast<size_t>(r)]);
        CHECK_THAT(errors[static_cast<size_t>(r)],
                   Catch::Contains("the ranks called different collectives") &&
                       Catch::Contains("rank 0: shared-memory call " + c.rank0) &&
                       Catch::Contains("rank 1: shared-memory call " + c.others));
      }
    }
  }
}

namespace {

// Rank r's buffer for `count` floats: registered (shared memory) or ordinary memory.
struct RankBuffer {
  std::shared_ptr<void> registered;
  std::vector<float> plain;
  float* data() { return registered ? static_cast<float*>(registered.get()) : plain.data(); }
};

}  // namespace

TEST_CASE("Registered buffers are reduced in place, exactly, whichever ranks registered theirs",
          "[shm]") {
  // Every rank registered (zero-copy), none (through the slots), and mixed (a registered buffer
  // read in place next to slot copies). The same closed forms and bitwise agreement in each.
  for (int n = 2; n <= 4; ++n) {
    for (const std::string mode : {"all", "mixed", "none"}) {
      INFO("world " << n << ", registered on " << mode);
      rendezvous::MemoryStore store;
      const size_t count = 3001;  // several slot chunks: the mixed case goes through the slots
      std::vector<std::vector<float>> sums(n), avgs(n), scattered(n), gathered(n), sent(n);
      std::vector<std::vector<float>> noisy(n);
      std::vector<uint64_t> copied(n);
      std::vector<std::vector<float>> in_place(n);
      onRanks(n, [&](int r) {
        auto shm = ShmCollectives::connect(store, options(r, n));
        RANK_REQUIRE(shm != nullptr);
        const bool mine = mode == "all" || (mode == "mixed" && r % 2 == 0);
        const size_t big = count * static_cast<size_t>(n);
        auto make = [&](size_t floats) {
          RankBuffer b;
          // Registration is collective: every rank registers, then keeps it or not.
          b.registered = shm->registerBuffer(floats * sizeof(float));
          RANK_REQUIRE(b.registered != nullptr);
          if (!mine) {
            b.registered.reset();
            b.plain.resize(floats);
          }
          return b;
        };
        RankBuffer a = make(count), b = make(big), c = make(count);
        float* x = a.data();
        for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(r + 1) * i;
        shm->allreduce(x, count, DType::kFloat32, ReduceOp::kSum);
        sums[r].assign(x, x + count);
        for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(2 * (r + 1));
        shm->allreduce(x, count, DType::kFloat32, ReduceOp::kAvg);
        avgs[r].assign(x, x + count);
        std::mt19937 random(static_cast<unsigned>(r));
        std::normal_distribution<float> normal;
        for (size_t i = 0; i < count; ++i) x[i] = normal(random) * 1e3f;
        shm->allreduce(x, count, DType::kFloat32, ReduceOp::kSum);
        noisy[r].assign(x, x + count);
        float* chunks = b.data();
        for (size_t i = 0; i < big; ++i) chunks[i] = static_cast<float>(i);
        shm->reduceScatter(chunks, c.data(), count, DType::kFloat32, ReduceOp::kSum);
        scattered[r].assign(c.data(), c.data() + count);
        for (size_t i = 0; i < count; ++i) c.data()[i] = static_cast<float>(r * 10000 + i);
        gathered[r].resize(big);
        shm->allGather(c.data(), gathered[r].data(), count, DType::kFloat32);
        for (size_t i = 0; i < count; ++i) x[i] = r == 1 ? static_cast<float>(i) : -1.f;
        shm->broadcast(x, count, DType::kFloat32, 1);
        sent[r].assign(x, x + count);
        copied[r] = shm->bytesCopiedIn();
        // In place (output = input + rank * count): the output is written while peers still
        // read the input, so this one goes through the slots.
        for (size_t i = 0; i < big; ++i) chunks[i] = static_cast<float>(i);
        float* own_row = chunks + static_cast<size_t>(r) * count;
        shm->reduceScatter(chunks, own_row, count, DType::kFloat32, ReduceOp::kSum);
        in_place[r].assign(own_row, own_row + count);
      });
      const float triangle = static_cast<float>(n * (n + 1) / 2);
      for (int r = 0; r < n; ++r) {
        INFO("rank " << r);
        CHECK(noisy[r] == noisy[0]);
        // Registered: nothing went through a slot; else every call copied its data in.
        const bool registered = mode == "all" || (mode == "mixed" && r % 2 == 0);
        CHECK((copied[r] == 0) == registered);
        for (size_t i = 0; i < count; ++i) {
          CHECK(sums[r][i] == triangle * i);
          CHECK(avgs[r][i] == static_cast<float>(n + 1));
          CHECK(scattered[r][i] == static_cast<float>(n) * (r * count + i));
          CHECK(in_place[r][i] == static_cast<float>(n) * (r * count + i));
          CHECK(sent[r][i] == static_cast<float>(i));
          for (int from = 0; from < n; ++from) {
            CHECK(gathered[r][from * count + i] == static_cast<float>(from * 10000 + i));
          }
        }
      }
    }
  }
}

TEST_CASE("A registered buffer is shared memory, gone from /dev/shm once every rank maps it",
          "[shm]") {
  rendezvous::MemoryStore store;
  std::vector<std::shared_ptr<void>> buffers(2);
  onRanks(2, [&](int r) {
    auto shm = ShmCollectives::connect(store, options(r, 2));
    RANK_REQUIRE(shm != nullptr);
    buffers[r] = shm->registerBuffer(1 << 20);
    RANK_REQUIRE(buffers[r] != nullptr);
    RANK_REQUIRE(shm->isRegistered(static_cast<char*>(buffers[r].get()) + 100, 1000));
    std::vector<float> elsewhere(4);
    RANK_REQUIRE(!shm->isRegistered(elsewhere.data(), 16));
  });
  CHECK(ourSegments().empty());
  // Each rank's part is its own memory, in a segment of this process's name (the launcher
  // removes such names after a crash), mapped though unlinked; the parts outlive the collectives.
  CHECK(buffers[0].get() != buffers[1].get());
  for (const auto& buffer : buffers) {
    const std::string file = cxxlaunch::testing::mappedFileOf(buffer.get());
    INFO(file);
    CHECK(file.starts_with("/dev/shm/cxxlaunch-" + std::to_string(::getpid()) + "-buffer-"));
    CHECK_THAT(file, Catch::EndsWith("(deleted)"));
    static_cast<char*>(buffer.get())[(1 << 20) - 1] = 1;  // all of it is writable
  }
}

TEST_CASE("Registering buffers of different sizes fails on every rank, naming both", "[shm]") {
  rendezvous::MemoryStore store;
  std::vector<std::string> errors(2);
  onRanks(2, [&](int r) {
    auto shm = ShmCollectives::connect(store, options(r, 2));
    RANK_REQUIRE(shm != nullptr);
    try {
      shm->registerBuffer(r == 0 ? 4096 : 8192);
    } catch (const CommunicationError& e) {
      errors[static_cast<size_t>(r)] = e.what();
    }
  });
  for (const auto& error : errors) {
    CHECK_THAT(error,
               Catch::Contains("rank 0: shared-memory call #1 registerBuffer of 4096 bytes") &&
                   Catch::Contains("rank 1: shared-memory call #1 registerBuffer of 8192"));
  }
}
