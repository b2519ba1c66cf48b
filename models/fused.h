#pragma once
// The Llama layers' memory-bound parts through the fused CUDA kernels
// (runtime/kernels/cuda/layers.h): RMSNorm, the rotary embedding from the cached tables,
// SwiGLU's gate, and the chunked cross-entropy's softmax (models/chunked_loss.cc). Each function
// takes the kernel where its tensors are on a GPU, fp32 or bf16 alike, and cxxlaunch was built with
// its CUDA kernels; everywhere else (the CPU, another dtype, mixed dtypes as under autocast) it is
// the unfused LibTorch math it always was, so the CPU's results do not change. The fused forms
// carry their own backward (autograd Functions), and differ from the unfused math by fp32 rounding
// only (tests/kernels/cuda_layers_test.cc).
//
// The kernels run on LibTorch's current CUDA stream of the tensors' device.
//
// Thread-safety: as any LibTorch op.

#include <torch/types.h>

namespace cxxlaunch::models {

// Whether this build has the fused kernels (nvcc was found when it was built).
bool fusedKernelsBuilt();

// HF's LlamaRMSNorm: weight * dtype(x * rsqrt(mean(x^2) + eps)), the statistics in fp32.
torch::Tensor rmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// silu(gate) * up.
torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up);

// The rotary embedding of a projection's output x [B, T, heads * head_dim] with cos and sin as
// LlamaModel passes them ([T, head_dim], or per row [B, 1, T, head_dim]), HF's
// x * cos + rotate_half(x) * sin. -> [B, T, heads * head_dim].
torch::Tensor rotary(const torch::Tensor& x, int64_t heads, const torch::Tensor& cos,
                     const torch::Tensor& sin);

namespace detail {
// Whether the fused kernels take these tensors: all on one GPU, one dtype (fp32 or bf16).
bool fusable(std::initializer_list<const torch::Tensor*> tensors);
// The chunked loss's softmax half: lse [rows] and the rows' losses (lse - the label's logit) of
// logits [rows, vocab] in one pass; and in place, the logits' gradient
// (softmax - onehot) * scale (scale: a one-element fp32 tensor on the logits' device).
std::pair<torch::Tensor, torch::Tensor> crossEntropyRows(const torch::Tensor& logits,
                                                         const torch::Tensor& labels);
void crossEntropyGradInPlace(torch::Tensor& logits, const torch::Tensor& labels,
                             const torch::Tensor& lse, const torch::Tensor& scale);
}  // namespace detail

}  // namespace cxxlaunch::models
