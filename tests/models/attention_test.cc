// models/attention.h: the math path (LibTorch < 2.0) and the sdpa path (>= 2.0) give the same
// outputs and gradients. On every build the sdpa path's translation of the mask and of GQA runs
// against sdpaReference (sdpa's documented semantics in plain ops); where this LibTorch has
// scaled_dot_product_attention, attention() runs it, on the CPU and, where there is one, on a
// GPU in bf16. And the model's cached rotary tables give what fresh ones give.

#include "models/attention.h"

#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "models/llama.h"

using namespace cxxlaunch::models;

namespace {

constexpr int64_t kBatch = 2, kHeads = 4, kLength = 9, kDim = 8;

struct Inputs {
  torch::Tensor q, k, v;
};

Inputs inputs(int64_t kv_heads, torch::ScalarType dtype, const torch::Device& device) {
  auto generator = at::detail::createCPUGenerator(11 + kv_heads);
  auto make = [&](int64_t heads) {
    return torch::randn({kBatch, heads, kLength, kDim}, generator)
        .to(device, dtype)
        .requires_grad_();
  };
  return {make(kHeads), make(kv_heads), make(kv_heads)};
}

// The masks the model makes: none (the plain causal batch), padding ([B, 1, T, T], row 0 left-
// padded by three, so its first queries see no key), two packed examples per row.
torch::Tensor maskOf(const std::string& kind) {
  const torch::Tensor causal = torch::ones({kLength, kLength}, torch::kBool).triu(1);
  if (kind == "causal") return {};
  if (kind == "padding") {
    torch::Tensor padding = torch::zeros({kBatch, 1, 1, kLength}, torch::kBool);
    padding[0].narrow(-1, 0, 3).fill_(true);
    return causal | padding;
  }
  // Packed: row 0 starts a second example at 4, row 1 at 6.
  torch::Tensor segment = torch::zeros({kBatch, kLength}, torch::kLong);
  segment[0].narrow(0, 4, kLength - 4).fill_(1);
  segment[1].narrow(0, 6, kLength - 6).fill_(1);
  const torch::Tensor other = segment.unsqueeze(2) != segment.unsqueeze(1);
  return (causal.unsqueeze(0) | other).unsqueeze(1);
}

struct Result {
  torch::Tensor out, grad_q, grad_k, grad_v;
};

template <typename Attend>
Result run(const Inputs& in, Attend attend) {
  for (const auto* t : {&in.q, &in.k, &in.v}) {
    if (t->grad().defined()) t->mutable_grad().zero_();
  }
  const torch::Tensor out = attend(in.q, in.k, in.v);
  // A weight per output element, so that every gradient path counts.
  const torch::Tensor weights =
      torch::linspace(-1, 1, out.numel(), torch::kDouble).view(out.sizes()).to(out.options());
  (out * weights).sum().backward();
  return {out.detach().cpu().to(torch::kDouble), in.q.grad().cpu().to(torch::kDouble),
          in.k.grad().cpu().to(torch::kDouble), in.v.grad().cpu().to(torch::kDouble)};
}

void checkClose(const Result& a, const Result& b, double rtol, double atol) {
  CHECK_FALSE(a.out.isnan().any().item<bool>());
  CHECK(torch::allclose(a.out, b.out, rtol, atol));
  CHECK(torch::allclose(a.grad_q, b.grad_q, rtol, atol));
  CHECK(torch::allclose(a.grad_k, b.grad_k, rtol, atol));
  CHECK(torch::allclose(a.grad_v, b.grad_v, rtol, atol));
}

}  // namespace

TEST_CASE("The math path equals sdpa's semantics, with every mask and head grouping",
          "[attention]") {
  const auto kind = GENERATE(as<std::string>{}, "causal", "padding", "packed");
  const int64_t kv_heads = GENERATE(4, 2, 1);
  const bool takes_gqa = GENERATE(true, false);
  CAPTURE(kind, kv_heads, takes_gqa);
  const Inputs in = inputs(kv_heads, torch::kDouble, torch::kCPU);
  const torch::Tensor masked = maskOf(kind);
  const Result math =
      run(in, [&](auto& q, auto& k, auto& v) { return mathAttention(q, k, v, masked); });
  const Result sdpa = run(in, [&](auto& q, auto& k, auto& v) {
    return sdpaAttention(q, k, v, masked, sdpaReference, takes_gqa);
  });
  checkClose(math, sdpa, 1e-10, 1e-12);
  // The mask counts: seeing every key gives another result.
  const Result unmasked = run(in, [&](auto& q, auto& k, auto& v) {
    return mathAttention(q, k, v, torch::zeros({kLength, kLength}, torch::kBool));
  });
  CHECK_FALSE(torch::allclose(math.out, unmasked.out, 1e-3, 1e-3));
}

TEST_CASE("A query that sees no key gets a uniform row on both paths, not NaN", "[attention]") {
  const Inputs in = inputs(2, torch::kDouble, torch::kCPU);
  const torch::Tensor masked = maskOf("padding");
  const torch::Tensor math = mathAttention(in.q, in.k, in.v, masked);
  const torch::Tensor sdpa = sdpaAttention(in.q, in.k, in.v, masked, sdpaReference, true);
  // Row 0's first query sees nothing: the mean of every value of its K/V head.
  const torch::Tensor uniform = in.v.select(0, 0).mean(1).repeat_interleave(2, 0);
  CHECK(torch::allclose(math.select(0, 0).select(1, 0), uniform, 1e-10, 1e-12));
  CHECK(torch::allclose(sdpa.select(0, 0).select(1, 0), uniform, 1e-10, 1e-12));
}

TEST_CASE("attention() is this build's path and equals the math", "[attention]") {
  INFO("this build's attention: " << (kAttentionUsesSdpa ? "LibTorch's sdpa" : "the math")
                                  << (kSdpaTakesGqa ? ", GQA by enable_gqa" : ""));
  const auto kind = GENERATE(as<std::string>{}, "causal", "padding", "packed");
  const int64_t kv_heads = GENERATE(4, 1);
  CAPTURE(kind, kv_heads);
  const Inputs in = inputs(kv_heads, torch::kFloat, torch::kCPU);
  const torch::Tensor masked = maskOf(kind);
  const Result math =
      run(in, [&](auto& q, auto& k, auto& v) { return mathAttention(q, k, v, masked); });
  const Result ours =
      run(in, [&](auto& q, auto& k, auto& v) { return attention(q, k, v, masked); });
  checkClose(math, ours, 1e-4, 1e-5);
  if (torch::cuda::is_available()) {  // the flash / memory-efficient kernels, in bf16
    const Inputs gpu = inputs(kv_heads, torch::kBFloat16, torch::kCUDA);
    const torch::Tensor gpu_masked = masked.defined() ? masked.cuda() : masked;
    const Result gpu_math = run(gpu, [&](auto& q, auto& k, auto& v) {
      return mathAttention(q.to(torch::kFloat), k.to(torch::kFloat), v.to(torch::kFloat),
                           gpu_masked);
    });
    const Result gpu_ours =
        run(gpu, [&](auto& q, auto& k, auto& v) { return attention(q, k, v, gpu_masked); });
    checkClose(gpu_math, gpu_ours, 3e-2, 3e-2);
  }
}

TEST_CASE("The model's cached rotary tables give what fresh tables give", "[attention]") {
  LlamaConfig c;
  c.hidden_size = 32;
  c.intermediate_size = 40;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 30;
  torch::manual_seed(3);
  LlamaForCausalLM model(c);
  torch::NoGradGuard no_grad;
  const torch::Tensor ids = torch::randint(c.vocab_size, {2, 100}, torch::kLong);
  // A long sequence first (the tables grow past 64 rows), then a short one (a part of them), then
  // the short one at explicit positions (rows gathered), against a model that never saw the long.
  const torch::Tensor long_logits = model(ids);
  const torch::Tensor short_ids = ids.narrow(1, 0, 7);
  const torch::Tensor after_long = model(short_ids);
  torch::manual_seed(3);
  LlamaForCausalLM fresh(c);
  CHECK(torch::equal(after_long, fresh(short_ids)));
  CHECK(torch::allclose(long_logits.narrow(1, 0, 7), after_long, 1e-5, 1e-6));
  const torch::Tensor positions = torch::arange(7, torch::kLong).repeat({2, 1});
  // (An explicit mask then, which sdpa runs in another kernel than is_causal.)
  CHECK(torch::allclose(model->forward(short_ids, {}, positions), after_long, 1e-5, 1e-6));
}
