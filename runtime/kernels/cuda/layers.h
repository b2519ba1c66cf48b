#pragma once
// Fused CUDA kernels of the Llama layers, on contiguous device arrays: RMSNorm forward and
// backward, the rotary embedding from cached tables (in place or not), SwiGLU, and the softmax
// half of the chunked linear + cross-entropy (the matmuls stay cuBLAS's). Each does in one pass
// over memory what the unfused LibTorch math does in several (RMSNorm: about eight kernels and
// their fp32 temporaries), with the same math in fp32 (models/fused.h wires them into the model;
// tests/kernels/cuda_layers_test.cc holds them to the unfused math, forward and gradients).
//
// Activations are fp32 or bf16 (raw bits), as `dtype` says; statistics (inv_rms, logsumexp,
// losses, the RMSNorm weight's gradient) are fp32. Where the unfused math rounds an intermediate
// to the activations' dtype (HF's RMSNorm casts the normed x before the weight, silu's output is
// a tensor of its own), the kernels round it too, so they differ from it by fp32 rounding only.
//
// As optimizers.h: every function queues its work on `stream` and returns at once; bad arguments
// throw InvalidArgument, a failed launch CudaError; arrays of one call must not overlap except
// where a function works in place.

#include <cstdint>

#include "runtime/kernels/cuda/device.h"

namespace cxxlaunch::runtime::kernels::cuda {

enum class DType { kFloat32, kBFloat16 };

// HF's LlamaRMSNorm over `rows` rows of `cols`: y = weight * dtype(x * inv_rms) with
// inv_rms = 1 / sqrt(mean(x^2) + eps) in fp32. x, y [rows, cols]; weight [cols]; inv_rms [rows]
// receives each row's, for the backward.
void rmsNormForward(const void* x, const void* weight, void* y, float* inv_rms, int64_t rows,
                    int64_t cols, float eps, DType dtype, Stream stream);

// The gradients of rmsNormForward from grad_y [rows, cols]: grad_x [rows, cols] (dtype) and
// grad_weight [cols] (fp32, overwritten), the sum over rows made in a fixed order (run-to-run
// deterministic). `scratch`: rmsNormBackwardScratch(rows, cols) floats of device memory.
int64_t rmsNormBackwardScratch(int64_t rows, int64_t cols);
void rmsNormBackward(const void* grad_y, const void* x, const void* weight, const float* inv_rms,
                     void* grad_x, float* grad_weight, float* scratch, int64_t rows, int64_t cols,
                     DType dtype, Stream stream);

// The rotary embedding (HF's rotate_half form) of x [tokens, heads, head_dim], the projection's
// output as it lies, into out (x itself: in place): for i < h = head_dim / 2, p the position,
//   out[i] = x[i] cos[p][i] - x[i + h] sin[p][i],  out[i + h] = x[i + h] cos[p][i + h] + x[i]
//   sin[p][i + h].
// cos and sin: [table_rows, head_dim] fp32 (models' cached tables). positions: [tokens] int64,
// each < table_rows; null: token t is at t % row_length (rows of row_length tokens from 0).
// `inverse` applies the transpose (the backward: the rotation by -angle).
void rotary(const void* x, void* out, const float* cos, const float* sin, const int64_t* positions,
            int64_t tokens, int64_t row_length, int64_t heads, int64_t head_dim, bool inverse,
            DType dtype, Stream stream);

// SwiGLU's gate: out = dtype(silu(gate)) * up, n elements.
void swigluForward(const void* gate, const void* up, void* out, int64_t n, DType dtype,
                   Stream stream);
// Its gradients from grad_out: grad_gate = grad_out * up * silu'(gate), grad_up = grad_out *
// dtype(silu(gate)).
void swigluBackward(const void* grad_out, const void* gate, const void* up, void* grad_gate,
                    void* grad_up, int64_t n, DType dtype, Stream stream);

// The cross-entropy of rows of logits [rows, vocab] against labels [rows] (int64, each in
// [0, vocab)): lse[r] = logsumexp(logits[r]) and loss[r] = lse[r] - logits[r][labels[r]], fp32,
// in one pass over the logits (an online max and sum).
void crossEntropyForward(const void* logits, const int64_t* labels, float* lse, float* loss,
                         int64_t rows, int64_t vocab, DType dtype, Stream stream);
// The logits' gradient, in place of the logits: (softmax(logits[r]) - onehot(labels[r])) * scale,
// softmax from the forward's lse, *scale a device float (d loss / d sum of the rows' losses).
void crossEntropyBackward(void* logits, const int64_t* labels, const float* lse, const float* scale,
                          int64_t rows, int64_t vocab, DType dtype, Stream stream);

}  // namespace cxxlaunch::runtime::kernels::cuda
