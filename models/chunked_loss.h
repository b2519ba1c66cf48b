#pragma once
// The causal-LM loss without the full logits: the LM head and the cross-entropy computed in
// chunks of tokens, as Cut Cross-Entropy and Liger's fused linear cross-entropy do, so that the
// [tokens, vocab] logits in fp32 never exist, forward or backward. For Qwen2's vocabulary
// (151,936) at 2,048 tokens those logits are 1.2 GB, and the plain path holds about three of them
// at once (the logits, log_softmax's output, their gradient).
//
//   // instead of causalLmLoss(model(input_ids, mask), labels):
//   acc.backward(cxxlaunch::models::chunkedCausalLmLoss(model, input_ids, labels, mask));
//
// The loss and its gradients are HF's (causalLmLoss's): logits at t predict labels at t + 1,
// labels -100 are ignored, the mean over the rest in fp32 (nan when every label is ignored, as
// PyTorch's 0/0, with zero gradients).
//
// How (Cut Cross-Entropy's way): the forward keeps only each token's logsumexp; the backward
// computes each chunk's logits again and turns them into softmax - onehot in place, then into the
// chunk's hidden gradient and its share of the head's gradient. Liger's way (every gradient
// computed in the forward) would hold a [vocab, hidden] fp32 gradient from the forward to the
// backward, through the whole model's backward, and produce the head's gradient before the
// backward pass reaches it, outside the runtime's gradient hooks; recomputing costs one more
// chunk matmul per chunk instead. Tokens whose label is ignored are dropped before the head (a
// prompt masked by a completion-only loss costs nothing).
//
// The head's gradient goes to the weight tensor passed in through autograd, once per call: to the
// parameter's own accumulator (where DDP's and the sharded strategies' gradient hooks sit), or
// through the cast that made a low-precision compute copy. Under autocast (mixed precision) the
// chunks' matmuls run in the autocast dtype, as the plain lm_head's do.
//
// Thread-safety: as any LibTorch op.

#include <torch/types.h>

#include <cstdint>

#include "models/llama.h"

namespace cxxlaunch::models {

struct ChunkedLossOptions {
  // Tokens per chunk; 0: as many as keep one chunk's fp32 logits within chunk_bytes.
  int64_t chunk_tokens = 0;
  // A chunk's fp32 logits, [tokens, vocab] * 4 bytes. The step's own memory is the head's
  // gradient plus one to two of these in fp32 (measured: bench/chunked_loss.cc), more with a
  // bf16 head (its casts of the chunk).
  int64_t chunk_bytes = int64_t{128} << 20;
};

// The tokens per chunk `options` give for this vocabulary (at least 1).
int64_t chunkTokens(int64_t vocab_size, const ChunkedLossOptions& options = {});

// Cross-entropy of the logits hidden weight^T against labels, averaged over the labels that are
// not -100, in fp32, without those logits: hidden [N, H], weight [V, H] (any floating dtype, the
// same device), labels [N] int64. Throws InvalidArgument for mismatched shapes and for labels
// outside [0, V) other than -100.
torch::Tensor chunkedCrossEntropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                  const torch::Tensor& labels,
                                  const ChunkedLossOptions& options = {});

// causalLmLoss(matmul(hidden, weight^T), labels) without the logits: hidden [B, T, H] (the final
// normed hidden states), labels [B, T]; the label shift as causalLmLoss's.
torch::Tensor chunkedCausalLmLoss(const torch::Tensor& hidden, const torch::Tensor& weight,
                                  const torch::Tensor& labels,
                                  const ChunkedLossOptions& options = {});

// causalLmLoss(model(input_ids, attention_mask), labels) without the logits, through the model's
// own head: lm_head (gathered in time as a shard unit under ZeRO-3 / FULL_SHARD, as the model's
// forward gathers it) or, tied, the embedding's weight.
torch::Tensor chunkedCausalLmLoss(LlamaForCausalLM& model, const torch::Tensor& input_ids,
                                  const torch::Tensor& labels,
                                  const torch::Tensor& attention_mask = {},
                                  const ChunkedLossOptions& options = {});
// The same for packed rows: causalLmLoss(model(input_ids, attention_mask, position_ids), labels)
// without the logits (position_ids as LlamaForCausalLM's forward takes them; undefined: 0..T-1).
torch::Tensor chunkedCausalLmLoss(LlamaForCausalLM& model, const torch::Tensor& input_ids,
                                  const torch::Tensor& labels, const torch::Tensor& attention_mask,
                                  const torch::Tensor& position_ids,
                                  const ChunkedLossOptions& options = {});

}  // namespace cxxlaunch::models
