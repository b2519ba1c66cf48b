#include "models/attention.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <cmath>
#include <limits>

namespace cxxlaunch::models {
namespace {

#define CXXLAUNCH_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||            \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// The most negative finite value of `dtype`: a masked score, as HF's min_dtype. Finite, so a
// query that sees no key gets a uniform row instead of 0 / 0.
double lowestOf(c10::ScalarType dtype) {
  switch (dtype) {
    case torch::kBFloat16:
      return static_cast<double>(std::numeric_limits<c10::BFloat16>::lowest());
    case torch::kHalf:
      return static_cast<double>(std::numeric_limits<c10::Half>::lowest());
    case torch::kDouble:
      return std::numeric_limits<double>::lowest();
    default:
      return std::numeric_limits<float>::lowest();
  }
}

torch::Tensor causalMasked(int64_t queries, int64_t keys, const torch::Device& device) {
  return torch::ones({queries, keys}, torch::TensorOptions().dtype(torch::kBool).device(device))
      .triu(1);
}

// [B, KV, T, d] -> [B, KV * group, T, d], each head `group` times in turn (HF's repeat_kv).
torch::Tensor repeatKv(const torch::Tensor& t, int64_t group) {
  if (group == 1) return t;
  const int64_t b = t.size(0), kv = t.size(1), len = t.size(2), d = t.size(3);
  return t.unsqueeze(2).expand({b, kv, group, len, d}).reshape({b, kv * group, len, d});
}

#if CXXLAUNCH_TORCH_AT_LEAST(2, 0)
torch::Tensor librarySdpa(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const torch::Tensor& attn_mask, bool is_causal,
                          [[maybe_unused]] bool enable_gqa) {
#if CXXLAUNCH_TORCH_AT_LEAST(2, 5)
  if (attn_mask.defined()) {
    return at::scaled_dot_product_attention(q, k, v, attn_mask, 0.0, is_causal, {}, enable_gqa);
  }
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, is_causal, {}, enable_gqa);
#else
  if (attn_mask.defined())
    return at::scaled_dot_product_attention(q, k, v, attn_mask, 0.0, is_causal);
  return at::scaled_dot_product_attention(q, k, v, {}, 0.0, is_causal);
#endif
}
#endif

}  // namespace

#if CXXLAUNCH_TORCH_AT_LEAST(2, 0)
const bool kAttentionUsesSdpa = true;
#else
const bool kAttentionUsesSdpa = false;
#endif
#if CXXLAUNCH_TORCH_AT_LEAST(2, 5)
const bool kSdpaTakesGqa = true;
#else
const bool kSdpaTakesGqa = false;
#endif

torch::Tensor mathAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& masked) {
  const int64_t batch = q.size(0), heads = q.size(1), length = q.size(2), dim = q.size(3);
  const int64_t kv_heads = k.size(1), keys = k.size(2), group = heads / kv_heads;
  // The query heads of one K/V head as one [group * T, d] matrix: each K/V head is read where it
  // lies, never repeated.
  const torch::Tensor grouped = q.reshape({batch, kv_heads, group * length, dim});
  torch::Tensor scores = torch::matmul(grouped, k.transpose(2, 3))
                             .view({batch, heads, length, keys})
                             .div(std::sqrt(static_cast<double>(dim)));
  // The softmax in fp32 (double stays double).
  scores = scores.to(c10::promoteTypes(q.scalar_type(), torch::kFloat))
               .masked_fill(masked.defined() ? masked : causalMasked(length, keys, q.device()),
                            std::numeric_limits<float>::lowest());
  const torch::Tensor weights = torch::softmax(scores, -1).to(q.scalar_type());
  return torch::matmul(weights.view({batch, kv_heads, group * length, keys}), v)
      .view({batch, heads, length, dim});
}

torch::Tensor sdpaAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& masked, const Sdpa& sdpa, bool takes_gqa) {
  const int64_t group = q.size(1) / k.size(1);
  if (!masked.defined()) {  // the plain causal batch: no mask tensor at all (the flash kernel)
    if (takes_gqa) return sdpa(q, k, v, {}, true, group > 1);
    return sdpa(q, repeatKv(k, group), repeatKv(v, group), {}, true, false);
  }
  const torch::Tensor bias =
      torch::zeros(masked.sizes(), q.options()).masked_fill(masked, lowestOf(q.scalar_type()));
  return sdpa(q, repeatKv(k, group), repeatKv(v, group), bias, false, false);
}

torch::Tensor sdpaReference(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& attn_mask, bool is_causal, bool enable_gqa) {
  const int64_t length = q.size(-2), keys = k.size(-2);
  torch::Tensor bias = torch::zeros({length, keys}, q.options());
  if (is_causal) {
    bias.masked_fill_(causalMasked(length, keys, q.device()),
                      -std::numeric_limits<double>::infinity());
  }
  if (attn_mask.defined()) {
    bias = attn_mask.scalar_type() == torch::kBool
               ? bias.masked_fill(attn_mask.logical_not(), -std::numeric_limits<double>::infinity())
               : attn_mask + bias;
  }
  torch::Tensor key = k, value = v;
  if (enable_gqa) {
    const int64_t group = q.size(-3) / k.size(-3);
    key = k.repeat_interleave(group, -3);
    value = v.repeat_interleave(group, -3);
  }
  const torch::Tensor scores =
      torch::matmul(q, key.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1))) + bias;
  return torch::matmul(torch::softmax(scores, -1), value);
}

torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& masked) {
#if CXXLAUNCH_TORCH_AT_LEAST(2, 0)
  return sdpaAttention(q, k, v, masked, librarySdpa, kSdpaTakesGqa);
#else
  return mathAttention(q, k, v, masked);
#endif
}

}  // namespace cxxlaunch::models
