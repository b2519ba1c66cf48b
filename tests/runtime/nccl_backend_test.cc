// NcclBackend's collectives in closed form on the GPUs of this machine: at world 1, and at world
// N (one thread per device) when there are N > 1 devices. Rank r contributes the values
// (r + 1) * (i % 7 + 1), small integers that every dtype holds exactly, so each result is known
// without arithmetic on the GPU: sums, averages, maxima, minima, scatters, gathers, broadcasts,
// in fp32, bf16 and int64, a subgroup of the world, and host memory (staged by the backend).
//
// Needs a GPU: labelled `gpu` (the default test preset excludes it), and without a device the
// program exits with 77 before any test (tests/support/gpu_test_main.cc), which ctest reports as
// skipped. On a GPU machine: `ctest --test-dir build -L gpu`, or scripts/gpu-check.sh.

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "rendezvous/memory_store.h"
#include "runtime/comm/backend.h"
#include "runtime/comm/reduce.h"
#include "runtime/kernels/cuda/device.h"
#include "tests/support/ranks.h"

using namespace cxxlaunch::runtime;
namespace cuda = cxxlaunch::runtime::kernels::cuda;

namespace {

constexpr size_t kCount = 1000;  // per rank, not a multiple of NCCL's chunks

double contribution(int rank, size_t i) { return (rank + 1) * static_cast<double>(i % 7 + 1); }

// Host bytes of `values` in `dtype`, and back.
std::vector<char> encode(const std::vector<double>& values, DType dtype) {
  std::vector<char> bytes(values.size() * dtypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    char* at = bytes.data() + i * dtypeSize(dtype);
    if (dtype == DType::kFloat32) {
      const auto v = static_cast<float>(values[i]);
      std::memcpy(at, &v, sizeof(v));
    } else if (dtype == DType::kBFloat16) {
      const uint16_t v = floatToBfloat16(static_cast<float>(values[i]));
      std::memcpy(at, &v, sizeof(v));
    } else {
      const auto v = static_cast<int64_t>(values[i]);
      std::memcpy(at, &v, sizeof(v));
    }
  }
  return bytes;
}
std::vector<double> decode(const std::vector<char>& bytes, DType dtype) {
  std::vector<double> values(bytes.size() / dtypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    const char* at = bytes.data() + i * dtypeSize(dtype);
    if (dtype == DType::kFloat32) {
      float v;
      std::memcpy(&v, at, sizeof(v));
      values[i] = v;
    } else if (dtype == DType::kBFloat16) {
      uint16_t v;
      std::memcpy(&v, at, sizeof(v));
      values[i] = bfloat16ToFloat(v);
    } else {
      int64_t v;
      std::memcpy(&v, at, sizeof(v));
      values[i] = static_cast<double>(v);
    }
  }
  return values;
}

// One rank's device buffer filled with `values`, read back after the collectives.
struct OnDevice {
  OnDevice(const std::vector<double>& values, DType dtype)
      : dtype(dtype), buffer(values.size() * dtypeSize(dtype)) {
    const auto bytes = encode(values, dtype);
    cuda::copyToDevice(buffer.data(), bytes.data(), bytes.size());
  }
  explicit OnDevice(size_t count, DType dtype) : dtype(dtype), buffer(count * dtypeSize(dtype)) {}
  std::vector<double> read() const {
    std::vector<char> bytes(buffer.bytes());
    cuda::copyToHost(bytes.data(), buffer.data(), bytes.size());
    return decode(bytes, dtype);
  }
  DType dtype;
  cuda::DeviceBuffer buffer;
};

// What every rank saw, filled by the rank threads and checked by the test thread (Catch2's
// assertions are not thread-safe).
struct Seen {
  std::vector<double> sum, avg, max, min, scattered, gathered, broadcast, subgroup_sum;
  double host_sum = 0;                 // a host value, staged through device memory
  std::vector<int64_t> host_gathered;  // host input and output
};

std::vector<Seen> runCollectives(int world, DType dtype) {
  auto store = std::make_shared<cxxlaunch::rendezvous::MemoryStore>();
  std::vector<Seen> seen(static_cast<size_t>(world));
  cxxlaunch::testing::onRanks(world, [&](int rank) {
    BackendOptions options;
    options.rank = rank;
    options.world_size = world;
    options.store = store;
    options.device = rank;
    auto backend = makeNcclBackend(options);
    std::vector<double> mine(kCount), chunks(kCount * static_cast<size_t>(world));
    for (size_t i = 0; i < kCount; ++i) mine[i] = contribution(rank, i);
    for (size_t i = 0; i < chunks.size(); ++i) chunks[i] = contribution(rank, i);
    Seen& s = seen[static_cast<size_t>(rank)];
    for (auto [op, out] : {std::pair{ReduceOp::kSum, &s.sum}, std::pair{ReduceOp::kAvg, &s.avg},
                           std::pair{ReduceOp::kMax, &s.max}, std::pair{ReduceOp::kMin, &s.min}}) {
      if (op == ReduceOp::kAvg && dtype == DType::kInt64) continue;  // NCCL averages floats only
      OnDevice data(mine, dtype);
      backend->allreduce(data.buffer.data(), kCount, dtype, op)->wait();
      *out = data.read();
    }
    OnDevice input(chunks, dtype), output(kCount, dtype);
    backend->reduceScatter(input.buffer.data(), output.buffer.data(), kCount, dtype, ReduceOp::kSum)
        ->wait();
    s.scattered = output.read();
    OnDevice piece(mine, dtype), all(kCount * static_cast<size_t>(world), dtype);
    backend->allGather(piece.buffer.data(), all.buffer.data(), kCount, dtype)->wait();
    s.gathered = all.read();
    OnDevice root(mine, dtype);
    backend->broadcast(root.buffer.data(), kCount, dtype, world - 1)->wait();
    s.broadcast = root.read();
    backend->barrier()->wait();
    // A subgroup of every rank (the hybrid mode's cut), with its own communicator.
    std::vector<int> everyone;
    for (int r = 0; r < world; ++r) everyone.push_back(r);
    auto group = backend->subgroup(everyone, "test");
    OnDevice in_group(mine, dtype);
    group->allreduce(in_group.buffer.data(), kCount, dtype, ReduceOp::kSum)->wait();
    s.subgroup_sum = in_group.read();
    // Host memory: the control values strategies exchange (flags, norms, shapes).
    s.host_sum = rank + 1;
    backend->allreduce(&s.host_sum, 1, DType::kFloat64, ReduceOp::kSum)->wait();
    const int64_t shape[2] = {rank, 10 * rank};
    s.host_gathered.resize(2 * static_cast<size_t>(world));
    backend->allGather(shape, s.host_gathered.data(), 2, DType::kInt64)->wait();
  });
  return seen;
}

void checkClosedForm(int world, DType dtype) {
  const auto seen = runCollectives(world, dtype);
  double rank_sum = 0;  // sum over ranks of (r + 1)
  for (int r = 0; r < world; ++r) rank_sum += r + 1;
  for (int rank = 0; rank < world; ++rank) {
    INFO("world " << world << ", rank " << rank << ", " << dtypeName(dtype));
    const Seen& s = seen[static_cast<size_t>(rank)];
    for (size_t i = 0; i < kCount; ++i) {
      const double unit = static_cast<double>(i % 7 + 1);
      REQUIRE(s.sum[i] == rank_sum * unit);
      REQUIRE(s.subgroup_sum[i] == rank_sum * unit);
      REQUIRE(s.max[i] == world * unit);
      REQUIRE(s.min[i] == unit);
      if (dtype != DType::kInt64) REQUIRE(s.avg[i] == Approx(rank_sum * unit / world));
      REQUIRE(s.broadcast[i] == contribution(world - 1, i));
      const size_t global = static_cast<size_t>(rank) * kCount + i;  // this rank's chunk
      REQUIRE(s.scattered[i] == rank_sum * static_cast<double>(global % 7 + 1));
    }
    REQUIRE(s.host_sum == rank_sum);
    for (int from = 0; from < world; ++from) {
      REQUIRE(s.host_gathered[2 * static_cast<size_t>(from)] == from);
      REQUIRE(s.host_gathered[2 * static_cast<size_t>(from) + 1] == 10 * from);
      for (size_t i = 0; i < kCount; ++i) {
        REQUIRE(s.gathered[static_cast<size_t>(from) * kCount + i] == contribution(from, i));
      }
    }
  }
}

}  // namespace

TEST_CASE("NCCL collectives give closed-form results at world 1", "[nccl][gpu]") {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) checkClosedForm(1, dtype);
}

TEST_CASE("NCCL collectives give closed-form results on every GPU of the machine", "[nccl][gpu]") {
  const int devices = cuda::deviceCount();
  if (devices < 2) {
    WARN("one GPU here: world 1 only (the other case)");
    return;
  }
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
    checkClosedForm(devices, dtype);
  }
}
