// The CUDA kernels of the shard optimizers (runtime/kernels/cuda/optimizers.h) against the CPU
// loops (runtime/kernels/cpu/optimizers.h) on random data: the same element_math.h arithmetic,
// so the results agree bit for bit (the kernels are built without FMA contraction; Adam is
// allowed 1 ulp for sqrt and division; any NaN equals any NaN, as arithmetic on one gives the
// canonical NaN on the GPU and keeps the payload on x86), and the sums of squares to double
// rounding. The casts are integer code on both sides: their NaNs agree bit for bit too.
//
// Needs a GPU. Built wherever cxxlaunch_cuda is (CI compiles it without one) and registered
// with ctest under the label `gpu`, which the default test preset excludes; on a GPU machine:
//   ctest --test-dir build -L gpu        (or run build/tests/kernels/kernels_cuda_test)
// Without a device the program exits with 77 before any test (tests/support/gpu_test_main.cc),
// which ctest reports as skipped. Each case runs on counts that are and are not multiples of the
// 4-element vectors, and on arrays offset by one element (the kernels' unaligned, scalar path).

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/error.h"
#include "runtime/kernels/cpu/optimizers.h"
#include "runtime/kernels/cuda/device.h"
#include "runtime/kernels/cuda/optimizers.h"

namespace k = cxxlaunch::runtime::kernels;
namespace kc = cxxlaunch::runtime::kernels::cuda;

namespace {

uint32_t toBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
float fromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Floats as integers in the order of their values, so that a difference counts ulps.
int64_t ordered(float f) {
  const uint32_t u = toBits(f);
  return (u & 0x80000000u) != 0 ? -static_cast<int64_t>(u & 0x7fffffffu) : u;
}

struct Agreement {
  int64_t max_ulps = 0;
  int64_t not_bitwise = 0;
  size_t first_difference = 0;
};
Agreement compare(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  REQUIRE(gpu.size() == cpu.size());
  Agreement a;
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (toBits(gpu[i]) == toBits(cpu[i])) continue;
    // Arithmetic on a NaN: x86 keeps its payload, CUDA returns the canonical NaN. Both are NaN.
    if (std::isnan(gpu[i]) && std::isnan(cpu[i])) continue;
    if (a.not_bitwise++ == 0) a.first_difference = i;
    const int64_t ulps = std::isnan(gpu[i]) || std::isnan(cpu[i])
                             ? std::numeric_limits<int64_t>::max()
                             : std::llabs(ordered(gpu[i]) - ordered(cpu[i]));
    a.max_ulps = std::max(a.max_ulps, ulps);
  }
  return a;
}
void requireBitwise(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  const Agreement a = compare(gpu, cpu);
  CAPTURE(a.first_difference, a.max_ulps);
  REQUIRE(a.not_bitwise == 0);
}
void requireWithinOneUlp(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  const Agreement a = compare(gpu, cpu);
  CAPTURE(a.first_difference, a.not_bitwise);
  REQUIRE(a.max_ulps <= 1);
}

std::vector<float> uniform(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Every kind of float: normals of all exponents, denormals, zeros, infinities, NaNs.
std::vector<float> randomBits(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = fromBits(static_cast<uint32_t>(rng()));
  return v;
}

// A device copy of a host array, `offset` elements into its allocation (1: not 16-byte aligned).
template <class T>
class DeviceArray {
 public:
  DeviceArray(const std::vector<T>& host, size_t offset)
      : buffer_((host.size() + offset) * sizeof(T)),
        data_(static_cast<T*>(buffer_.data()) + offset),
        size_(host.size()) {
    if (size_ > 0) kc::copyToDevice(data_, host.data(), size_ * sizeof(T));
  }
  T* get() const { return data_; }
  std::vector<T> download() const {
    std::vector<T> host(size_);
    if (size_ > 0) kc::copyToHost(host.data(), data_, size_ * sizeof(T));
    return host;
  }

 private:
  kc::DeviceBuffer buffer_;
  T* data_;
  size_t size_;
};

k::AdamScalars adamScalars(bool decoupled, int t) {
  const double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, weight_decay = 0.01;
  const double bias_correction1 = 1 - std::pow(beta1, t);
  const double bias_correction2 = 1 - std::pow(beta2, t);
  k::AdamScalars s;
  s.decay = static_cast<float>(decoupled ? 1 - lr * weight_decay : 1);
  s.l2 = static_cast<float>(decoupled ? 0 : weight_decay);
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta1 = static_cast<float>(1 - beta1);
  s.one_minus_beta2 = static_cast<float>(1 - beta2);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = 1e-8f;
  s.step_size = static_cast<float>(lr / bias_correction1);
  return s;
}

}  // namespace

TEST_CASE("cuda adamStep equals the CPU loop (Adam and AdamW, first and later steps)",
          "[gpu][kernels]") {
  const int64_t n = GENERATE(1, 3, 4, 1021, (1 << 20) + 3);
  const size_t offset = GENERATE(0, 1);
  const bool decoupled = GENERATE(false, true);
  const int t = GENERATE(1, 7);
  CAPTURE(n, offset, decoupled, t);
  const size_t count = static_cast<size_t>(n);
  std::vector<float> param = uniform(count, -2, 2, 1), grad = uniform(count, -1, 1, 2);
  std::vector<float> m = uniform(count, -0.1f, 0.1f, 3), v = uniform(count, 0, 0.01f, 4);
  DeviceArray<float> d_param(param, offset), d_grad(grad, offset), d_m(m, offset), d_v(v, offset);
  const k::AdamScalars s = adamScalars(decoupled, t);
  kc::adamStep(d_param.get(), d_grad.get(), d_m.get(), d_v.get(), n, s, nullptr);
  k::adamStep(param.data(), grad.data(), m.data(), v.data(), n, s);
  requireWithinOneUlp(d_param.download(), param);
  requireWithinOneUlp(d_m.download(), m);
  requireWithinOneUlp(d_v.download(), v);
}

TEST_CASE("cuda sgdStep equals the CPU loop (momentum, dampening, nesterov, weight decay)",
          "[gpu][kernels]") {
  struct Case {
    float momentum, dampening, weight_decay;
    bool nesterov, with_buffer;
  };
  const Case c = GENERATE(Case{0, 0, 0, false, false}, Case{0, 0, 0.01f, false, true},
                          Case{0.9f, 0.1f, 0.01f, false, true}, Case{0.9f, 0, 0.01f, true, true});
  const int64_t n = GENERATE(3, 1021, (1 << 20) + 1);
  const size_t offset = GENERATE(0, 1);
  CAPTURE(c.momentum, c.dampening, c.weight_decay, c.nesterov, c.with_buffer, n, offset);
  const size_t count = static_cast<size_t>(n);
  std::vector<float> param = uniform(count, -2, 2, 5), buf(count, 0.0f);
  DeviceArray<float> d_param(param, offset), d_buf(buf, offset);
  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    const std::vector<float> grad = uniform(count, -1, 1, 10 + step);
    DeviceArray<float> d_grad(grad, offset);
    k::SgdScalars s;
    s.lr = 0.05f;
    s.momentum = c.momentum;
    s.dampening = c.dampening;
    s.weight_decay = c.weight_decay;
    s.nesterov = c.nesterov;
    s.first_step = step == 0;
    kc::sgdStep(d_param.get(), d_grad.get(), c.with_buffer ? d_buf.get() : nullptr, n, s, nullptr);
    k::sgdStep(param.data(), grad.data(), c.with_buffer ? buf.data() : nullptr, n, s);
    requireBitwise(d_param.download(), param);
    requireBitwise(d_buf.download(), buf);
  }
}

TEST_CASE("cuda sumOfSquares equals the exact sum to double rounding, deterministically",
          "[gpu][kernels]") {
  const int64_t n = GENERATE(1, 5, 1021, (1 << 22) + 3);
  const size_t offset = GENERATE(0, 1);
  CAPTURE(n, offset);
  const std::vector<float> x = uniform(static_cast<size_t>(n), -3, 3, 6);
  DeviceArray<float> d_x(x, offset);
  kc::DeviceBuffer result(kc::kSumOfSquaresScratch * sizeof(double));
  auto* r = static_cast<double*>(result.data());
  // The reference: each square is exact in double (48 significant bits), their sum in long
  // double (64). The CPU loop adds in one long chain, so its error grows with n (up to n
  // roundings: 1.5e-12 relative was seen at 4M elements); the GPU's per-thread chains are short.
  long double exact_sum = 0;
  for (const float v : x) exact_sum += static_cast<double>(v) * v;
  const auto exact = static_cast<double>(exact_sum);
  const double cpu = k::sumOfSquares(x.data(), n);
  REQUIRE(cpu == Approx(exact).epsilon(std::max(1e-12, static_cast<double>(n) * 0x1p-53)));

  kc::sumOfSquares(d_x.get(), n, r, false, nullptr);
  const double gpu = kc::readDouble(r, nullptr);
  REQUIRE(gpu == Approx(exact).epsilon(1e-12));
  kc::sumOfSquares(d_x.get(), n, r, false, nullptr);  // the same order of additions again
  REQUIRE(kc::readDouble(r, nullptr) == gpu);

  // Accumulated over two pieces: the sum of both.
  const int64_t half = n / 2;
  kc::sumOfSquares(d_x.get(), half, r, false, nullptr);
  kc::sumOfSquares(d_x.get() + half, n - half, r, true, nullptr);
  REQUIRE(kc::readDouble(r, nullptr) == Approx(exact).epsilon(1e-12));

  // No elements: zero, or the sum left as it was.
  kc::sumOfSquares(d_x.get(), 0, r, true, nullptr);
  REQUIRE(kc::readDouble(r, nullptr) == Approx(exact).epsilon(1e-12));
  kc::sumOfSquares(d_x.get(), 0, r, false, nullptr);
  REQUIRE(kc::readDouble(r, nullptr) == 0.0);
}

TEST_CASE("cuda scaleInPlace equals the CPU loop", "[gpu][kernels]") {
  const int64_t n = GENERATE(1, 1021, (1 << 20) + 2);
  const size_t offset = GENERATE(0, 1);
  CAPTURE(n, offset);
  std::vector<float> x = randomBits(static_cast<size_t>(n), 7);
  DeviceArray<float> d_x(x, offset);
  kc::scaleInPlace(d_x.get(), n, 0.3f, nullptr);
  k::scaleInPlace(x.data(), n, 0.3f);
  requireBitwise(d_x.download(), x);
}

TEST_CASE("cuda checkFinite and unscaleAndCheckFinite flag inf and NaN anywhere",
          "[gpu][kernels]") {
  const int64_t n = GENERATE(1, 6, 1021, (1 << 20) + 3);
  const size_t offset = GENERATE(0, 1);
  const float bad =
      GENERATE(0.0f /* none */, std::numeric_limits<float>::infinity(),
               -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN());
  const size_t count = static_cast<size_t>(n);
  const size_t at = GENERATE_COPY(values<size_t>({0, count / 2, count - 1}));
  CAPTURE(n, offset, toBits(bad), at);
  std::vector<float> x = uniform(count, -1e30f, 1e30f, 8);
  x[count / 3] = std::numeric_limits<float>::max();
  x[count - 1 - count / 3] = std::numeric_limits<float>::denorm_min();
  if (bad != 0) x[at] = bad;
  const bool expect_flag = bad != 0;  // NaN != 0 too

  DeviceArray<float> d_x(x, offset);
  kc::DeviceBuffer flag_buffer(sizeof(int32_t));
  auto* flag = static_cast<int32_t*>(flag_buffer.data());

  kc::clearFlag(flag, nullptr);
  kc::checkFinite(d_x.get(), n, flag, nullptr);
  REQUIRE(kc::readFlag(flag, nullptr) == expect_flag);
  REQUIRE(kc::readFlag(flag, nullptr) == !k::allFinite(x.data(), n));
  requireBitwise(d_x.download(), x);  // checking alone writes nothing

  const float inv_scale = 1.0f / 65536.0f;
  kc::clearFlag(flag, nullptr);
  kc::unscaleAndCheckFinite(d_x.get(), n, inv_scale, flag, nullptr);
  REQUIRE(kc::readFlag(flag, nullptr) == expect_flag);
  k::scaleInPlace(x.data(), n, inv_scale);
  requireBitwise(d_x.download(), x);

  // The flag is sticky: a clean buffer afterwards leaves it set.
  if (expect_flag) {
    const std::vector<float> clean = uniform(count, -1, 1, 9);
    DeviceArray<float> d_clean(clean, offset);
    kc::unscaleAndCheckFinite(d_clean.get(), n, inv_scale, flag, nullptr);
    REQUIRE(kc::readFlag(flag, nullptr));
  }
}

TEST_CASE("cuda casts to and from bfloat16 and half equal the CPU loops bit for bit",
          "[gpu][kernels]") {
  const int64_t n = GENERATE(1, 7, (1 << 20) + 3);
  const size_t offset = GENERATE(0, 1);
  const bool half = GENERATE(false, true);
  CAPTURE(n, offset, half);
  const size_t count = static_cast<size_t>(n);

  const std::vector<float> wide = randomBits(count, 12);
  DeviceArray<float> d_wide(wide, offset);
  DeviceArray<uint16_t> d_narrow(std::vector<uint16_t>(count, 0), offset);
  std::vector<uint16_t> narrow(count);
  if (half) {
    kc::castFloatToHalf(d_wide.get(), d_narrow.get(), n, nullptr);
    k::castFloatToHalf(wide.data(), narrow.data(), n);
  } else {
    kc::castFloatToBFloat16(d_wide.get(), d_narrow.get(), n, nullptr);
    k::castFloatToBFloat16(wide.data(), narrow.data(), n);
  }
  REQUIRE(d_narrow.download() == narrow);

  // Widening: every 16-bit pattern (repeated to n elements).
  std::vector<uint16_t> patterns(count);
  for (size_t i = 0; i < count; ++i) patterns[i] = static_cast<uint16_t>(i * 40503u);
  DeviceArray<uint16_t> d_patterns(patterns, offset);
  DeviceArray<float> d_back(std::vector<float>(count, 0.0f), offset);
  std::vector<float> back(count);
  if (half) {
    kc::castHalfToFloat(d_patterns.get(), d_back.get(), n, nullptr);
    k::castHalfToFloat(patterns.data(), back.data(), n);
  } else {
    kc::castBFloat16ToFloat(d_patterns.get(), d_back.get(), n, nullptr);
    k::castBFloat16ToFloat(patterns.data(), back.data(), n);
  }
  requireBitwise(d_back.download(), back);
}

TEST_CASE("cuda kernels: no elements is a no-op, a negative count is refused", "[gpu][kernels]") {
  kc::DeviceBuffer buffer(64);
  auto* x = static_cast<float*>(buffer.data());
  kc::adamStep(x, x, x, x, 0, k::AdamScalars{}, nullptr);
  kc::scaleInPlace(x, 0, 2.0f, nullptr);
  REQUIRE_THROWS_AS(kc::scaleInPlace(x, -1, 2.0f, nullptr), cxxlaunch::InvalidArgument);
  REQUIRE_THROWS_AS(kc::castFloatToHalf(x, nullptr, -5, nullptr), cxxlaunch::InvalidArgument);
  kc::synchronize(nullptr);
}

TEST_CASE("cuda errors name the failed call", "[gpu][kernels]") {
  // More memory than any GPU has: cudaMalloc fails, and the error says which call it was.
  try {
    kc::DeviceBuffer huge(std::size_t{1} << 60);
    FAIL("cudaMalloc of 2^60 bytes succeeded");
  } catch (const kc::CudaError& e) {
    CAPTURE(e.what());
    REQUIRE(std::string(e.what()).find("cudaMalloc") != std::string::npos);
  }
}
