// The CPU loops of the shard optimizers (runtime/kernels/cpu/optimizers.h) and the per-element
// math they share with the CUDA kernels (runtime/kernels/element_math.h), against closed forms
// and scalar references computed in double. No LibTorch: this builds in seconds.

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "runtime/kernels/cpu/optimizers.h"
#include "runtime/kernels/element_math.h"

namespace k = cxxlaunch::runtime::kernels;

namespace {

float fromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
uint32_t toBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// Deterministic values in [lo, hi) for arrays of any length.
std::vector<float> values(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// A few float roundings away from the double result: the loop rounds each operation to float,
// so the error bound scales with the terms the result was summed from (`scale`), which is more
// than the result itself where they cancel.
void requireClose(float actual, double expected, double scale) {
  REQUIRE(actual == Approx(expected).epsilon(4e-6).margin(8 * 1.2e-7 * scale + 1e-30));
}
void requireClose(float actual, double expected) { requireClose(actual, expected, 0); }

// Adam/AdamW scalars for step t, as torch::optim::Adam(W) (and FusedAdamW) derive them.
k::AdamScalars adamScalars(double lr, double beta1, double beta2, double eps, double weight_decay,
                           bool decoupled, int t) {
  const double bias_correction1 = 1 - std::pow(beta1, t);
  const double bias_correction2 = 1 - std::pow(beta2, t);
  return k::AdamScalars{.decay = static_cast<float>(decoupled ? 1 - lr * weight_decay : 1),
                        .l2 = static_cast<float>(decoupled ? 0 : weight_decay),
                        .beta1 = static_cast<float>(beta1),
                        .beta2 = static_cast<float>(beta2),
                        .one_minus_beta1 = static_cast<float>(1 - beta1),
                        .one_minus_beta2 = static_cast<float>(1 - beta2),
                        .bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2)),
                        .eps = static_cast<float>(eps),
                        .step_size = static_cast<float>(lr / bias_correction1)};
}

// One Adam/AdamW step by the textbook formulas, in double.
struct AdamExpected {
  double param, exp_avg, exp_avg_sq;
  double param_scale, exp_avg_scale;  // the sizes of the terms summed (see requireClose)
};
AdamExpected adamReference(double p, double g, double m, double v, double lr, double beta1,
                           double beta2, double eps, double weight_decay, bool decoupled, int t) {
  if (!decoupled) g += weight_decay * p;
  if (decoupled) p *= 1 - lr * weight_decay;
  const double exp_avg_scale = std::fabs(beta1 * m) + std::fabs((1 - beta1) * g);
  m = beta1 * m + (1 - beta1) * g;
  v = beta2 * v + (1 - beta2) * g * g;
  const double m_hat = m / (1 - std::pow(beta1, t));
  const double v_hat = v / (1 - std::pow(beta2, t));
  const double update = lr * m_hat / (std::sqrt(v_hat) + eps);
  return {p - update, m, v, std::fabs(p) + std::fabs(update), exp_avg_scale};
}

}  // namespace

TEST_CASE("adamStep: the first Adam step from zero state moves each parameter by about lr",
          "[kernels][cpu]") {
  // m_hat = g and v_hat = g^2 on step 1, so p1 = p0 - lr * g / (|g| + eps): a closed form.
  std::vector<float> param = {1.0f, -2.0f, 0.5f, 3.0f, -0.25f};
  const std::vector<float> grad = {0.5f, -0.125f, 2.0f, -1.0f, 0.0625f};
  std::vector<float> m(param.size(), 0.0f), v(param.size(), 0.0f);
  const double lr = 1e-2, eps = 1e-8;
  const auto s = adamScalars(lr, 0.9, 0.999, eps, 0, false, 1);
  const std::vector<float> p0 = param;
  k::adamStep(param.data(), grad.data(), m.data(), v.data(), static_cast<int64_t>(param.size()), s);
  for (size_t i = 0; i < param.size(); ++i) {
    requireClose(param[i], p0[i] - lr * grad[i] / (std::fabs(grad[i]) + eps));
    requireClose(m[i], 0.1 * grad[i]);
    requireClose(v[i], 0.001 * grad[i] * grad[i]);
  }
}

TEST_CASE("adamStep: Adam (L2) and AdamW (decoupled) steps match the formulas in double",
          "[kernels][cpu]") {
  const bool decoupled = GENERATE(false, true);
  const int t = GENERATE(1, 2, 10, 1000);
  CAPTURE(decoupled, t);
  const size_t n = 37;  // not a multiple of any vector width: the loop's tail runs too
  std::vector<float> param = values(n, -2, 2, 1), grad = values(n, -1, 1, 2);
  std::vector<float> m = values(n, -0.1f, 0.1f, 3), v = values(n, 0, 0.01f, 4);
  if (t == 1) std::fill(m.begin(), m.end(), 0.0f), std::fill(v.begin(), v.end(), 0.0f);
  const double lr = 3e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-6, wd = 0.1;
  const std::vector<float> p0 = param, m0 = m, v0 = v;
  k::adamStep(param.data(), grad.data(), m.data(), v.data(), static_cast<int64_t>(n),
              adamScalars(lr, beta1, beta2, eps, wd, decoupled, t));
  for (size_t i = 0; i < n; ++i) {
    CAPTURE(i);
    const auto e =
        adamReference(p0[i], grad[i], m0[i], v0[i], lr, beta1, beta2, eps, wd, decoupled, t);
    requireClose(param[i], e.param, e.param_scale);
    requireClose(m[i], e.exp_avg, e.exp_avg_scale);
    requireClose(v[i], e.exp_avg_sq);
  }
}

TEST_CASE("sgdStep: plain, momentum, dampening, nesterov and weight decay, first and later steps",
          "[kernels][cpu]") {
  struct Case {
    float momentum, dampening, weight_decay;
    bool nesterov;
  };
  const Case c = GENERATE(Case{0, 0, 0, false}, Case{0, 0, 0.01f, false}, Case{0.9f, 0, 0, false},
                          Case{0.9f, 0.1f, 0.01f, false}, Case{0.9f, 0, 0.01f, true},
                          Case{0.5f, 0.5f, 0, false});
  CAPTURE(c.momentum, c.dampening, c.weight_decay, c.nesterov);
  const size_t n = 37;
  const float lr = 0.05f;
  std::vector<float> param = values(n, -2, 2, 5);
  std::vector<float> buf(n, 0.0f);
  std::vector<double> p_ref(param.begin(), param.end()), buf_ref(n, 0.0);
  for (int step = 0; step < 3; ++step) {  // the first step seeds the buffer, later ones decay it
    CAPTURE(step);
    const std::vector<float> grad = values(n, -1, 1, 10 + step);
    const k::SgdScalars s{.lr = lr,
                          .momentum = c.momentum,
                          .dampening = c.dampening,
                          .weight_decay = c.weight_decay,
                          .nesterov = c.nesterov,
                          .first_step = step == 0};
    k::sgdStep(param.data(), grad.data(), c.momentum != 0 ? buf.data() : nullptr,
               static_cast<int64_t>(n), s);
    for (size_t i = 0; i < n; ++i) {
      double d = grad[i] + static_cast<double>(c.weight_decay) * p_ref[i];
      if (c.momentum != 0) {
        buf_ref[i] = step == 0 ? d : c.momentum * buf_ref[i] + (1.0 - c.dampening) * d;
        d = c.nesterov ? d + c.momentum * buf_ref[i] : buf_ref[i];
      }
      p_ref[i] -= lr * d;
      CAPTURE(i);
      REQUIRE(param[i] == Approx(p_ref[i]).epsilon(1e-5).margin(1e-6));
      if (c.momentum != 0) REQUIRE(buf[i] == Approx(buf_ref[i]).epsilon(1e-5).margin(1e-6));
    }
  }
}

TEST_CASE("sumOfSquares: exact for integers, zero for no elements", "[kernels][cpu]") {
  const int64_t n = 1001;
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 2 == 0 ? i : -i);
  const double m = n - 1;
  REQUIRE(k::sumOfSquares(x.data(), n) == m * (m + 1) * (2 * m + 1) / 6);
  REQUIRE(k::sumOfSquares(x.data(), 0) == 0.0);
  // Accumulated in double: 1e20^2 overflows float, not the sum.
  const float big[2] = {1e20f, -1e20f};
  REQUIRE(k::sumOfSquares(big, 2) == Approx(2.0 * 1e20f * 1e20f));
}

TEST_CASE("scaleInPlace multiplies every element", "[kernels][cpu]") {
  std::vector<float> x = values(37, -4, 4, 7);
  const std::vector<float> x0 = x;
  k::scaleInPlace(x.data(), static_cast<int64_t>(x.size()), 0.25f);  // a power of two: exact
  for (size_t i = 0; i < x.size(); ++i) REQUIRE(x[i] == x0[i] / 4);
}

TEST_CASE("allFinite: inf, -inf and NaN anywhere, max and denormals finite", "[kernels][cpu]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = values(37, -1, 1, 8);
  x[3] = std::numeric_limits<float>::max();
  x[4] = -std::numeric_limits<float>::max();
  x[5] = std::numeric_limits<float>::denorm_min();
  x[6] = -0.0f;
  REQUIRE(k::allFinite(x.data(), static_cast<int64_t>(x.size())));
  REQUIRE(k::allFinite(x.data(), 0));
  for (const float bad : {inf, -inf, nan, -nan, fromBits(0x7f800001u) /* signalling NaN */}) {
    for (const size_t at : {size_t{0}, size_t{17}, x.size() - 1}) {
      std::vector<float> y = x;
      y[at] = bad;
      CAPTURE(toBits(bad), at);
      REQUIRE_FALSE(k::allFinite(y.data(), static_cast<int64_t>(y.size())));
    }
  }
}

namespace {

struct Conversion {
  uint32_t from;  // float bits
  uint16_t to;
};

std::vector<uint16_t> narrowAll(const std::vector<Conversion>& cases, bool half) {
  std::vector<float> from;
  for (const auto& c : cases) from.push_back(fromBits(c.from));
  std::vector<uint16_t> to(from.size());
  if (half) {
    k::castFloatToHalf(from.data(), to.data(), static_cast<int64_t>(from.size()));
  } else {
    k::castFloatToBFloat16(from.data(), to.data(), static_cast<int64_t>(from.size()));
  }
  return to;
}

}  // namespace

TEST_CASE("castFloatToBFloat16: round to nearest even, NaN, infinities, denormals, max",
          "[kernels][cpu]") {
  const std::vector<Conversion> cases = {
      {0x3f800000u, 0x3f80},  // 1
      {0xbf800000u, 0xbf80},  // -1
      {0x3f808000u, 0x3f80},  // a tie between 0x3f80 and 0x3f81: to the even one
      {0x3f818000u, 0x3f82},  // a tie between 0x3f81 and 0x3f82: to the even one
      {0x3f808001u, 0x3f81},  // just above the tie
      {0x3f807fffu, 0x3f80},  // just below the tie
      {0x7f800000u, 0x7f80},  // inf
      {0xff800000u, 0xff80},  // -inf
      {0x7fc00000u, 0x7fc0},  // NaN
      {0xffc00001u, 0x7fc0},  // -NaN with a payload: LibTorch's canonical NaN
      {0x7f800001u, 0x7fc0},  // a signalling NaN does not round to inf
      {0x7f7fffffu, 0x7f80},  // the largest float rounds up to inf
      {0x7f7f0000u, 0x7f7f},  // the largest bfloat16
      {0x00000001u, 0x0000},  // the smallest denormal rounds to zero
      {0x00008000u, 0x0000},  // a denormal tie: to even (zero)
      {0x00018000u, 0x0002},  // a denormal tie: to even
      {0x007fffffu, 0x0080},  // the largest denormal rounds up to the smallest normal
      {0x80000000u, 0x8000},  // -0
  };
  const auto to = narrowAll(cases, false);
  for (size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(cases[i].from);
    REQUIRE(to[i] == cases[i].to);
  }
}

TEST_CASE("castBFloat16ToFloat and back is the identity on every bfloat16 but NaN",
          "[kernels][cpu]") {
  std::vector<uint16_t> all(65536);
  for (uint32_t b = 0; b < 65536; ++b) all[b] = static_cast<uint16_t>(b);
  std::vector<float> wide(all.size());
  std::vector<uint16_t> back(all.size());
  k::castBFloat16ToFloat(all.data(), wide.data(), static_cast<int64_t>(all.size()));
  k::castFloatToBFloat16(wide.data(), back.data(), static_cast<int64_t>(wide.size()));
  for (uint32_t b = 0; b < 65536; ++b) {
    CAPTURE(b);
    REQUIRE(toBits(wide[b]) == b << 16);  // widening is exact: the bits move up
    const bool nan = (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0;
    REQUIRE(back[b] == (nan ? 0x7fc0 : b));
  }
}

TEST_CASE("castFloatToHalf: round to nearest even, overflow, underflow, NaN, infinities",
          "[kernels][cpu]") {
  const std::vector<Conversion> cases = {
      {0x3f800000u, 0x3c00},  // 1
      {0xc0000000u, 0xc000},  // -2
      {0x3f801000u, 0x3c00},  // 1 + 2^-11: a tie between 1 and 1 + 2^-10, to the even one
      {0x3f803000u, 0x3c02},  // 1 + 3 * 2^-11: a tie, to the even one (up)
      {0x3f801001u, 0x3c01},  // just above the tie
      {0x477fe000u, 0x7bff},  // 65504, the largest half
      {0x477fefffu, 0x7bff},  // just below 65520 still rounds down to 65504
      {0x477ff000u, 0x7c00},  // 65520: the tie with 65536 goes to even, which is inf
      {0x7f7fffffu, 0x7c00},  // the largest float overflows to inf
      {0xff7fffffu, 0xfc00},  // and its negative to -inf
      {0x7f800000u, 0x7c00},  // inf
      {0xff800000u, 0xfc00},  // -inf
      {0x7fc00000u, 0x7e00},  // NaN
      {0xffc00001u, 0xfe00},  // -NaN keeps its sign (c10::Half does)
      {0x7f800001u, 0x7e00},  // a signalling NaN stays NaN
      {0x38800000u, 0x0400},  // 2^-14, the smallest normal half
      {0x387fc000u, 0x03ff},  // 2^-14 - 2^-24, the largest denormal half
      {0x387fe000u, 0x0400},  // a tie between the largest denormal and the smallest normal
      {0x33800000u, 0x0001},  // 2^-24, the smallest denormal half
      {0x33000000u, 0x0000},  // 2^-25: a tie between 0 and 2^-24, to even (zero)
      {0x33000001u, 0x0001},  // just above it
      {0x33c00000u, 0x0002},  // 3 * 2^-25: a tie between 1 and 2 units, to even (2)
      {0x34200000u, 0x0002},  // 5 * 2^-25: a tie between 2 and 3 units, to even (2)
      {0x00000001u, 0x0000},  // a float denormal underflows to zero
      {0x80000001u, 0x8000},  // keeping its sign
      {0x80000000u, 0x8000},  // -0
  };
  const auto to = narrowAll(cases, true);
  for (size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(cases[i].from);
    REQUIRE(to[i] == cases[i].to);
  }
}

TEST_CASE("castHalfToFloat is exact, and half to float and back is the identity but for NaN",
          "[kernels][cpu]") {
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<float> wide(all.size());
  std::vector<uint16_t> back(all.size());
  k::castHalfToFloat(all.data(), wide.data(), static_cast<int64_t>(all.size()));
  k::castFloatToHalf(wide.data(), back.data(), static_cast<int64_t>(wide.size()));
  for (uint32_t h = 0; h < 65536; ++h) {
    CAPTURE(h);
    const uint32_t exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    const double sign = (h & 0x8000) != 0 ? -1 : 1;
    if (exponent == 0x1f && mantissa != 0) {
      REQUIRE(std::isnan(wide[h]));
      REQUIRE(back[h] == ((h & 0x8000) | 0x7e00));
      continue;
    }
    double expected;  // the value by the IEEE binary16 definition
    if (exponent == 0x1f) {
      expected = sign * std::numeric_limits<double>::infinity();
    } else if (exponent == 0) {
      expected = sign * std::ldexp(static_cast<double>(mantissa), -24);
    } else {
      expected = sign * std::ldexp(1.0 + mantissa / 1024.0, static_cast<int>(exponent) - 15);
    }
    REQUIRE(static_cast<double>(wide[h]) == expected);
    REQUIRE(std::signbit(wide[h]) == ((h & 0x8000) != 0));
    REQUIRE(back[h] == h);
  }
}

namespace {

// c10::Half's CPU conversion (fp16_ieee_from_fp32_value in c10/util/Half.h, from the FP16
// library): a float-arithmetic formulation, independent of element_math's integer one.
uint16_t c10FloatToHalf(float f) {
  const float scale_to_inf = fromBits(UINT32_C(0x77800000));
  const float scale_to_zero = fromBits(UINT32_C(0x08800000));
  float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;
  const uint32_t w = toBits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & UINT32_C(0x80000000);
  uint32_t bias = shl1_w & UINT32_C(0xFF000000);
  if (bias < UINT32_C(0x71000000)) bias = UINT32_C(0x71000000);
  base = fromBits((bias >> 1) + UINT32_C(0x07800000)) + base;
  const uint32_t bits = toBits(base);
  const uint32_t exp_bits = (bits >> 13) & UINT32_C(0x00007C00);
  const uint32_t mantissa_bits = bits & UINT32_C(0x00000FFF);
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) |
                               (shl1_w > UINT32_C(0xFF000000) ? UINT16_C(0x7E00) : nonsign));
}

}  // namespace

TEST_CASE("floatToHalf equals c10::Half's conversion on every exponent and rounding case",
          "[kernels][cpu]") {
  // Every sign, exponent and kept 10-bit mantissa, with the 13 dropped bits at the rounding
  // boundaries (zero, just above, just below and at the tie, all ones), then random floats.
  const uint32_t dropped[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x0800, 0x17ff};
  std::vector<float> from;
  from.reserve(2 * 256 * 1024 * std::size(dropped) + (1 << 20));
  for (uint32_t top = 0; top < 2 * 256 * 1024; ++top) {
    for (const uint32_t low : dropped) from.push_back(fromBits((top << 13) | low));
  }
  std::mt19937 rng(11);
  for (int i = 0; i < (1 << 20); ++i) from.push_back(fromBits(static_cast<uint32_t>(rng())));
  std::vector<uint16_t> to(from.size());
  k::castFloatToHalf(from.data(), to.data(), static_cast<int64_t>(from.size()));
  size_t mismatches = 0;
  uint32_t first = 0;
  for (size_t i = 0; i < from.size(); ++i) {
    if (to[i] != c10FloatToHalf(from[i]) && mismatches++ == 0) first = toBits(from[i]);
  }
  CAPTURE(first);
  REQUIRE(mismatches == 0);
}
