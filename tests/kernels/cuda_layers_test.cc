// The Llama layers' fused CUDA kernels (runtime/kernels/cuda/layers.h) against the unfused
// LibTorch math on the CPU, on random data, forward and gradients (LibTorch's autograd), in fp32
// (to fp32 rounding) and bf16 (to a bf16 rounding step: both sides round intermediates to bf16,
// not always the same ones). Shapes are not multiples of the kernels' 256 threads.
//
// Needs a GPU: part of kernels_cuda_test (label gpu), skipped where there is none.

#include <torch/torch.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "runtime/kernels/cuda/device.h"
#include "runtime/kernels/cuda/layers.h"

namespace kc = cxxlaunch::runtime::kernels::cuda;

namespace {

kc::DeviceBuffer upload(const torch::Tensor& t) {
  const torch::Tensor c = t.detach().contiguous();
  kc::DeviceBuffer buffer(c.nbytes());
  kc::copyToDevice(buffer.data(), c.data_ptr(), c.nbytes());
  return buffer;
}

torch::Tensor download(const kc::DeviceBuffer& buffer, at::IntArrayRef sizes,
                       torch::ScalarType dtype) {
  kc::synchronize(nullptr);
  torch::Tensor t = torch::empty(sizes, dtype);
  kc::copyToHost(t.data_ptr(), buffer.data(), t.nbytes());
  return t;
}

kc::DType kernelType(torch::ScalarType dtype) {
  return dtype == torch::kFloat ? kc::DType::kFloat32 : kc::DType::kBFloat16;
}

// fp32: a few fp32 roundings; bf16: about one bf16 step (2^-8) of the largest value.
double toleranceOf(torch::ScalarType dtype) { return dtype == torch::kFloat ? 2e-5 : 2e-2; }

void checkClose(const torch::Tensor& ours, const torch::Tensor& unfused, double tolerance) {
  const torch::Tensor a = ours.to(torch::kDouble), b = unfused.to(torch::kDouble);
  REQUIRE(a.sizes() == b.sizes());
  const double error = (a - b).abs().max().item<double>();
  const double scale = b.abs().max().item<double>();
  CAPTURE(error, scale, tolerance);
  CHECK(error <= tolerance * std::max(scale, 1e-3));
}

torch::Tensor randn(at::IntArrayRef sizes, torch::ScalarType dtype, uint64_t seed) {
  return torch::randn(sizes, at::detail::createCPUGenerator(seed)).to(dtype);
}

}  // namespace

TEST_CASE("RMSNorm forward and backward equal the unfused math", "[layers]") {
  const auto dtype = GENERATE(torch::kFloat, torch::kBFloat16);
  const int64_t cols = GENERATE(300, 2048 + 5);
  const int64_t rows = 37;
  const float eps = 1e-5f;
  CAPTURE(dtype, cols);
  torch::Tensor x = randn({rows, cols}, dtype, 1).mul(3).requires_grad_();
  torch::Tensor w = randn({cols}, dtype, 2).add(1).requires_grad_();
  const torch::Tensor grad_y = randn({rows, cols}, dtype, 3);
  // HF's LlamaRMSNorm, as models/llama.cc computes it.
  const torch::Tensor x32 = x.to(torch::kFloat);
  const torch::Tensor inv_rms = torch::rsqrt(x32.pow(2).mean(-1, true) + eps);
  const torch::Tensor y = w * (x32 * inv_rms).to(dtype);
  y.backward(grad_y);

  kc::DeviceBuffer dx = upload(x), dw = upload(w), dgy = upload(grad_y);
  kc::DeviceBuffer dy(x.nbytes()), dinv(rows * sizeof(float)), dgx(x.nbytes()),
      dgw(cols * sizeof(float)), scratch(kc::rmsNormBackwardScratch(rows, cols) * sizeof(float));
  kc::rmsNormForward(dx.data(), dw.data(), dy.data(), static_cast<float*>(dinv.data()), rows, cols,
                     eps, kernelType(dtype), nullptr);
  kc::rmsNormBackward(dgy.data(), dx.data(), dw.data(), static_cast<const float*>(dinv.data()),
                      dgx.data(), static_cast<float*>(dgw.data()),
                      static_cast<float*>(scratch.data()), rows, cols, kernelType(dtype), nullptr);
  checkClose(download(dy, {rows, cols}, dtype), y, toleranceOf(dtype));
  checkClose(download(dinv, {rows}, torch::kFloat), inv_rms.squeeze(1), 2e-6);
  checkClose(download(dgx, {rows, cols}, dtype), x.grad(), toleranceOf(dtype));
  checkClose(download(dgw, {cols}, torch::kFloat), w.grad(), toleranceOf(dtype));
}

TEST_CASE("The rotary embedding equals rotate_half's math, and its inverse the gradient",
          "[layers]") {
  const auto dtype = GENERATE(torch::kFloat, torch::kBFloat16);
  const bool explicit_positions = GENERATE(false, true);
  CAPTURE(dtype, explicit_positions);
  const int64_t batch = 2, length = 11, heads = 3, dim = 16, table_rows = 32;
  const int64_t tokens = batch * length;
  // HF's tables: the frequencies twice, [table_rows, dim].
  const torch::Tensor inv_freq =
      1.0 / torch::pow(10000.0, torch::arange(0, dim, 2).to(torch::kFloat) / double(dim));
  const torch::Tensor freqs = torch::arange(table_rows).to(torch::kFloat).unsqueeze(1) * inv_freq;
  const torch::Tensor angles = torch::cat({freqs, freqs}, 1);
  const torch::Tensor cos = angles.cos(), sin = angles.sin();
  const torch::Tensor positions =
      explicit_positions ? torch::randint(table_rows, {tokens}, at::detail::createCPUGenerator(4))
                         : torch::arange(length).repeat({batch});

  torch::Tensor x = randn({tokens, heads, dim}, dtype, 5).requires_grad_();
  const torch::Tensor grad_y = randn({tokens, heads, dim}, dtype, 6);
  const torch::Tensor c = cos.index_select(0, positions).unsqueeze(1).to(dtype);
  const torch::Tensor s = sin.index_select(0, positions).unsqueeze(1).to(dtype);
  const torch::Tensor rotated =
      torch::cat({-x.narrow(2, dim / 2, dim / 2), x.narrow(2, 0, dim / 2)}, 2);
  const torch::Tensor y = x * c + rotated * s;
  y.backward(grad_y);

  kc::DeviceBuffer dx = upload(x), dg = upload(grad_y), dcos = upload(cos), dsin = upload(sin),
                   dpos = upload(positions), dgx(grad_y.nbytes());
  const auto* pos = explicit_positions ? static_cast<const int64_t*>(dpos.data()) : nullptr;
  const auto* c32 = static_cast<const float*>(dcos.data());
  const auto* s32 = static_cast<const float*>(dsin.data());
  // The forward in place, the backward into another array.
  kc::rotary(dx.data(), dx.data(), c32, s32, pos, tokens, length, heads, dim, false,
             kernelType(dtype), nullptr);
  kc::rotary(dg.data(), dgx.data(), c32, s32, pos, tokens, length, heads, dim, true,
             kernelType(dtype), nullptr);
  checkClose(download(dx, {tokens, heads, dim}, dtype), y, toleranceOf(dtype));
  checkClose(download(dgx, {tokens, heads, dim}, dtype), x.grad(), toleranceOf(dtype));
}

TEST_CASE("SwiGLU forward and backward equal silu(gate) * up", "[layers]") {
  const auto dtype = GENERATE(torch::kFloat, torch::kBFloat16);
  CAPTURE(dtype);
  const int64_t n = 4099;
  torch::Tensor gate = randn({n}, dtype, 7).mul(4).requires_grad_();
  torch::Tensor up = randn({n}, dtype, 8).requires_grad_();
  const torch::Tensor grad_out = randn({n}, dtype, 9);
  const torch::Tensor out = torch::silu(gate) * up;
  out.backward(grad_out);

  kc::DeviceBuffer dgate = upload(gate), dup = upload(up), dgrad = upload(grad_out);
  kc::DeviceBuffer dout(out.nbytes()), dgg(out.nbytes()), dgu(out.nbytes());
  kc::swigluForward(dgate.data(), dup.data(), dout.data(), n, kernelType(dtype), nullptr);
  kc::swigluBackward(dgrad.data(), dgate.data(), dup.data(), dgg.data(), dgu.data(), n,
                     kernelType(dtype), nullptr);
  checkClose(download(dout, {n}, dtype), out, toleranceOf(dtype));
  checkClose(download(dgg, {n}, dtype), gate.grad(), toleranceOf(dtype));
  checkClose(download(dgu, {n}, dtype), up.grad(), toleranceOf(dtype));
}

TEST_CASE("The cross-entropy's logsumexp, losses and logits' gradient equal the unfused math",
          "[layers]") {
  const auto dtype = GENERATE(torch::kFloat, torch::kBFloat16);
  const int64_t vocab = GENERATE(1007, 151936);
  CAPTURE(dtype, vocab);
  const int64_t rows = vocab > 10000 ? 3 : 13;
  const float scale = 0.37f;
  torch::Tensor logits = randn({rows, vocab}, dtype, 10).mul(5).requires_grad_();
  const torch::Tensor labels = torch::randint(vocab, {rows}, at::detail::createCPUGenerator(11));
  // The plain path's math (models/llama.cc's causalLmLoss): fp32 logits, cross_entropy.
  const torch::Tensor f32 = logits.to(torch::kFloat);
  const torch::Tensor lse = torch::logsumexp(f32, 1);
  const torch::Tensor losses = lse - f32.gather(1, labels.unsqueeze(1)).squeeze(1);
  torch::nn::functional::cross_entropy(
      f32, labels, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
      .mul(scale)
      .backward();

  kc::DeviceBuffer dlogits = upload(logits), dlabels = upload(labels),
                   dscale = upload(torch::full({1}, scale));
  kc::DeviceBuffer dlse(rows * sizeof(float)), dloss(rows * sizeof(float));
  kc::crossEntropyForward(dlogits.data(), static_cast<const int64_t*>(dlabels.data()),
                          static_cast<float*>(dlse.data()), static_cast<float*>(dloss.data()), rows,
                          vocab, kernelType(dtype), nullptr);
  kc::crossEntropyBackward(dlogits.data(), static_cast<const int64_t*>(dlabels.data()),
                           static_cast<const float*>(dlse.data()),
                           static_cast<const float*>(dscale.data()), rows, vocab, kernelType(dtype),
                           nullptr);
  checkClose(download(dlse, {rows}, torch::kFloat), lse, 1e-6);
  checkClose(download(dloss, {rows}, torch::kFloat), losses, 1e-5);
  checkClose(download(dlogits, {rows, vocab}, dtype), logits.grad(), toleranceOf(dtype));
}

TEST_CASE("The layer kernels refuse negative sizes and odd head sizes", "[layers]") {
  CHECK_THROWS_AS(kc::swigluForward(nullptr, nullptr, nullptr, -1, kc::DType::kFloat32, nullptr),
                  cxxlaunch::InvalidArgument);
  CHECK_THROWS_AS(kc::rotary(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1, 1, 3, false,
                             kc::DType::kFloat32, nullptr),
                  cxxlaunch::InvalidArgument);
}
