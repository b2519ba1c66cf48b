// Collectives in closed form over the Fake backend (ranks as threads), and the 16-bit float
// conversions the CPU backends reduce with.

#include "runtime/comm/backend.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "common/error.h"
#include "rendezvous/memory_store.h"
#include "runtime/comm/reduce.h"
#include "support/ranks.h"

using namespace cxxlaunch::runtime;
using cxxlaunch::testing::onRanks;

TEST_CASE("Fake collectives give closed-form results for worlds 1 to 4", "[backend]") {
  for (int n = 1; n <= 4; ++n) {
    INFO("world " << n);
    auto world = makeFakeWorld(n);
    const size_t count = 10;
    std::vector<std::vector<float>> sums(n), avgs(n), maxes(n), gathered(n), scattered(n), bcast(n);
    onRanks(n, [&](int r) {
      auto b = makeFakeBackend(world, r);
      auto& s = sums[r];
      s.assign(count, static_cast<float>(r + 1));
      avgs[r].assign(count, static_cast<float>(2 * (r + 1)));
      maxes[r].assign(count, static_cast<float>(r));
      std::vector<float> mine(count, static_cast<float>(r));
      gathered[r].resize(count * n);
      std::vector<float> chunks(count * n);
      for (size_t i = 0; i < chunks.size(); ++i) chunks[i] = static_cast<float>(i);
      scattered[r].resize(count);
      bcast[r].assign(count, static_cast<float>(r + 100));
      std::vector<WorkPtr> works = {
          b->allreduce(s.data(), count, DType::kFloat32, ReduceOp::kSum),
          b->allreduce(avgs[r].data(), count, DType::kFloat32, ReduceOp::kAvg),
          b->allreduce(maxes[r].data(), count, DType::kFloat32, ReduceOp::kMax),
          b->allGather(mine.data(), gathered[r].data(), count, DType::kFloat32),
          b->reduceScatter(chunks.data(), scattered[r].data(), count, DType::kFloat32,
                           ReduceOp::kSum),
          b->broadcast(bcast[r].data(), count, DType::kFloat32, n - 1),
          b->barrier()};
      for (auto& w : works) w->wait();
    });
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) {
        CHECK(sums[r][i] == static_cast<float>(n * (n + 1) / 2));
        CHECK(avgs[r][i] == static_cast<float>(n + 1));
        CHECK(maxes[r][i] == static_cast<float>(n - 1));
        CHECK(scattered[r][i] == static_cast<float>(n * (r * count + i)));
        CHECK(bcast[r][i] == static_cast<float>(n - 1 + 100));
      }
      for (size_t i = 0; i < count * n; ++i) CHECK(gathered[r][i] == static_cast<float>(i / count));
    }
  }
}

TEST_CASE("Integer and 16-bit reductions", "[backend]") {
  std::vector<int64_t> a = {1, -5, 7}, b = {2, 3, -9};
  reduceInto(a.data(), b.data(), 3, DType::kInt64, ReduceOp::kMin);
  CHECK(a == std::vector<int64_t>{1, -5, -9});
  for (float v : {0.f, 1.f, -2.5f, 65504.f, 6.1035156e-05f, 5.9604645e-08f, 1e-3f}) {
    CHECK(halfToFloat(floatToHalf(v)) == Approx(v).epsilon(1e-3));
  }
  CHECK(std::isinf(halfToFloat(floatToHalf(1e6f))));
  CHECK(bfloat16ToFloat(floatToBfloat16(3.0f)) == 3.0f);
  CHECK(bfloat16ToFloat(floatToBfloat16(1.00390625f)) == 1.0f);  // ties to even
  std::vector<uint16_t> h = {floatToHalf(1.5f), floatToHalf(2.f)};
  std::vector<uint16_t> g = {floatToHalf(0.5f), floatToHalf(2.f)};
  reduceInto(h.data(), g.data(), 2, DType::kFloat16, ReduceOp::kSum);
  divideBy(h.data(), 2, DType::kFloat16, 2);
  CHECK(halfToFloat(h[0]) == 1.f);
  CHECK(halfToFloat(h[1]) == 2.f);
  CHECK(dtypeSize(DType::kBFloat16) == 2);
}

// Random bytes (any bit pattern: subnormals, NaNs, wrapping integers) of `count` elements.
static std::vector<unsigned char> randomBytes(std::mt19937& gen, size_t bytes) {
  std::vector<unsigned char> out(bytes);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : out) b = static_cast<unsigned char>(byte(gen));
  return out;
}

TEST_CASE(
    "A pair reduction gives the bits of a reduction then a division, in place and into a third "
    "buffer",
    "[backend]") {
  std::mt19937 gen(7);
  const size_t count = 1001;  // not a multiple of any vector width
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64, DType::kUInt8,
                      DType::kFloat16, DType::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
      INFO("dtype " << static_cast<int>(dtype) << ", op " << static_cast<int>(op));
      const size_t bytes = count * dtypeSize(dtype);
      auto a = randomBytes(gen, bytes);
      auto b = randomBytes(gen, bytes);
      auto expected = a;
      reduceInto(expected.data(), b.data(), count, dtype, op);
      if (op == ReduceOp::kAvg) divideBy(expected.data(), count, dtype, 2);
      std::vector<unsigned char> into(bytes);
      reducePairInto(into.data(), a.data(), b.data(), count, dtype, op);
      CHECK(std::memcmp(into.data(), expected.data(), bytes) == 0);
      reducePair(a.data(), b.data(), count, dtype, op);
      CHECK(std::memcmp(a.data(), expected.data(), bytes) == 0);
      CHECK(std::memcmp(b.data(), expected.data(), bytes) == 0);
    }
  }
}

TEST_CASE("Division by a power of two and by any other count gives the quotient", "[backend]") {
  std::mt19937 gen(11);
  const size_t count = 4097;
  for (int n : {1, 2, 3, 4, 6, 8, 1024}) {
    INFO("n " << n);
    auto bits = randomBytes(gen, count * sizeof(float));
    std::vector<float> data(count);
    std::memcpy(data.data(), bits.data(), bits.size());
    data[0] = 1.4e-45F;  // the smallest subnormal: halved, it rounds to zero (even)
    auto expected = data;
    for (auto& v : expected) v = v / static_cast<float>(n);
    divideBy(data.data(), count, DType::kFloat32, n);
    CHECK(std::memcmp(data.data(), expected.data(), count * sizeof(float)) == 0);
    std::vector<double> wide(count, 3.0);
    wide[1] = 4.9e-324;
    divideBy(wide.data(), count, DType::kFloat64, n);
    CHECK(wide[0] == 3.0 / n);
    CHECK(wide[1] == 4.9e-324 / n);
  }
}

TEST_CASE("The NCCL backend runs on a GPU, or fails plainly without one", "[backend]") {
  BackendOptions options;
  options.store = std::make_shared<cxxlaunch::rendezvous::MemoryStore>();
  options.device = 0;
  if (!ncclCompiledIn()) {
    REQUIRE_THROWS_WITH(makeNcclBackend(options), Catch::Contains("built without CUDA and NCCL"));
    return;
  }
  std::unique_ptr<Backend> nccl;
  try {
    nccl = makeNcclBackend(options);
  } catch (const cxxlaunch::CommunicationError& e) {
    // No device here (CI): the error names the call and the rank.
    CHECK_THAT(e.what(), Catch::Contains("cudaSetDevice") && Catch::Contains("rank 0 of 1"));
    return;
  }
  nccl->barrier()->wait(std::chrono::seconds(60));  // a GPU machine: a world of one works
  CHECK(nccl->name() == "nccl");
}
