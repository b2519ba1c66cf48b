#pragma once
// The Llama family's attention core, softmax(q k^T / sqrt(d) + mask) v over grouped-query heads,
// in one of two ways chosen when cxxlaunch is COMPILED, from the LibTorch it is built against:
//
// - LibTorch >= 2.0 has scaled_dot_product_attention (sdpa): flash and memory-efficient kernels
//   that never hold the [T, T] scores. A plain causal batch goes as is_causal with no mask (the
//   flash kernel); from 2.5 on, GQA as enable_gqa, so K/V are never repeated. Padding and packed
//   examples (a block-diagonal causal mask) go as an explicit additive mask, which the
//   memory-efficient kernel takes; with a mask K/V are repeated per query head (a [B, H, T, d]
//   copy, as HF's repeat_kv), because the masked kernels take GQA only through the math fallback.
// - Older ones (Debian's 1.13) run the math: the scores in the inputs' dtype, the softmax in
//   fp32, each query head group against its one K/V head (views, no repeated K/V).
//
// The two are tested equal on every build: sdpaAttention's translation of our mask into sdpa's
// arguments runs on 1.13 too, against sdpaReference (sdpa's semantics as PyTorch documents them,
// in plain ops), and on >= 2.0 against LibTorch's own sdpa (tests/models/attention_test.cc).
//
// Thread-safety: as any LibTorch op.

#include <torch/types.h>

#include <functional>

namespace cxxlaunch::models {

// Whether this build's attention runs through LibTorch's scaled_dot_product_attention, and
// whether that one takes GQA (enable_gqa) itself.
extern const bool kAttentionUsesSdpa;
extern const bool kSdpaTakesGqa;

// q [B, H, T, d], k and v [B, KV, T, d] with H a multiple of KV (query head h reads K/V head
// h / (H / KV)); `masked`: true where a query must not see a key, the causal part included,
// [T, T] or [B, 1, T, T]; undefined: the plain causal mask. -> [B, H, T, d] in q's dtype.
// A query that sees no key (left padding) gets a uniform row, as HF's, not NaN.
torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& masked);

// The math path (what LibTorch < 2.0 builds run), on every build.
torch::Tensor mathAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& masked);

// scaled_dot_product_attention's arguments, as LibTorch >= 2.5 takes them (dropout 0, the
// default scale): attn_mask additive in q's dtype or undefined.
using Sdpa = std::function<torch::Tensor(const torch::Tensor& q, const torch::Tensor& k,
                                         const torch::Tensor& v, const torch::Tensor& attn_mask,
                                         bool is_causal, bool enable_gqa)>;

// The sdpa path with `sdpa` as the kernel: our mask turned into is_causal or an additive mask,
// GQA into enable_gqa (when `takes_gqa`) or repeated K/V. attention() is this with LibTorch's.
torch::Tensor sdpaAttention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& masked, const Sdpa& sdpa, bool takes_gqa);

// scaled_dot_product_attention's documented semantics in plain ops (any LibTorch), for tests.
torch::Tensor sdpaReference(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const torch::Tensor& attn_mask, bool is_causal, bool enable_gqa);

}  // namespace cxxlaunch::models
