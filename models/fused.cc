#include "models/fused.h"

#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/torch.h>

#include "common/error.h"
#if defined(CXXLAUNCH_HAVE_CUDA_KERNELS)
#include "runtime/kernels/cuda/layers.h"
#endif
#if defined(CXXLAUNCH_TORCH_CUDA)
#include <c10/cuda/CUDAStream.h>
#endif

namespace cxxlaunch::models {
namespace {

torch::Tensor rotateHalf(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

torch::Tensor unfusedRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const torch::Tensor x32 = x.to(torch::kFloat);
  const torch::Tensor normed = x32 * torch::rsqrt(x32.pow(2).mean(-1, true) + eps);
  return weight * normed.to(x.scalar_type());
}

#if defined(CXXLAUNCH_HAVE_CUDA_KERNELS)
namespace cuda = runtime::kernels::cuda;
using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

cuda::Stream currentStream([[maybe_unused]] const torch::Device& device) {
#if defined(CXXLAUNCH_TORCH_CUDA)
  return c10::cuda::getCurrentCUDAStream(device.index()).stream();
#else
  return nullptr;  // LibTorch's default stream: the legacy one
#endif
}

cuda::DType dtypeOf(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat ? cuda::DType::kFloat32 : cuda::DType::kBFloat16;
}

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, double eps) {
    const c10::DeviceGuard guard(x.device());
    const torch::Tensor input = x.contiguous(), w = weight.contiguous();
    const int64_t cols = input.size(-1), rows = input.numel() / std::max<int64_t>(cols, 1);
    torch::Tensor y = torch::empty_like(input);
    torch::Tensor inv_rms = torch::empty({rows}, input.options().dtype(torch::kFloat));
    cuda::rmsNormForward(input.data_ptr(), w.data_ptr(), y.data_ptr(), inv_rms.data_ptr<float>(),
                         rows, cols, static_cast<float>(eps), dtypeOf(input),
                         currentStream(x.device()));
    ctx->save_for_backward({input, w, inv_rms});
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const tensor_list saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &w = saved[1], &inv_rms = saved[2];
    const c10::DeviceGuard guard(x.device());
    const torch::Tensor grad_y = grad_outputs[0].contiguous();
    const int64_t cols = x.size(-1), rows = x.numel() / std::max<int64_t>(cols, 1);
    torch::Tensor grad_x = torch::empty_like(x);
    torch::Tensor grad_w = torch::empty({cols}, x.options().dtype(torch::kFloat));
    torch::Tensor scratch =
        torch::empty({cuda::rmsNormBackwardScratch(rows, cols)}, x.options().dtype(torch::kFloat));
    cuda::rmsNormBackward(grad_y.data_ptr(), x.data_ptr(), w.data_ptr(), inv_rms.data_ptr<float>(),
                          grad_x.data_ptr(), grad_w.data_ptr<float>(), scratch.data_ptr<float>(),
                          rows, cols, dtypeOf(x), currentStream(x.device()));
    return {grad_x, grad_w.to(w.scalar_type()), torch::Tensor()};
  }
};

class SwigluFunction : public torch::autograd::Function<SwigluFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& gate,
                               const torch::Tensor& up) {
    const c10::DeviceGuard guard(gate.device());
    const torch::Tensor g = gate.contiguous(), u = up.contiguous();
    torch::Tensor out = torch::empty_like(g);
    cuda::swigluForward(g.data_ptr(), u.data_ptr(), out.data_ptr(), g.numel(), dtypeOf(g),
                        currentStream(g.device()));
    ctx->save_for_backward({g, u});
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const tensor_list saved = ctx->get_saved_variables();
    const torch::Tensor &g = saved[0], &u = saved[1];
    const c10::DeviceGuard guard(g.device());
    const torch::Tensor grad = grad_outputs[0].contiguous();
    torch::Tensor grad_gate = torch::empty_like(g), grad_up = torch::empty_like(u);
    cuda::swigluBackward(grad.data_ptr(), g.data_ptr(), u.data_ptr(), grad_gate.data_ptr(),
                         grad_up.data_ptr(), g.numel(), dtypeOf(g), currentStream(g.device()));
    return {grad_gate, grad_up};
  }
};

// cos and sin [tokens or T, head_dim] fp32, contiguous: the kernel's table, row t % rows for
// token t (no positions: the tables are already each token's). Out of place: x, a projection's
// output, is a view of the matmul's result, which autograd's in-place rules would have to track.
class RotaryFunction : public torch::autograd::Function<RotaryFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t heads,
                               const torch::Tensor& cos, const torch::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["heads"] = heads;
    return rotate(x.contiguous(), heads, cos, sin, false);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const tensor_list saved = ctx->get_saved_variables();
    const torch::Tensor grad = rotate(grad_outputs[0].contiguous(),
                                      ctx->saved_data["heads"].toInt(), saved[0], saved[1], true);
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }

 private:
  static torch::Tensor rotate(const torch::Tensor& x, int64_t heads, const torch::Tensor& cos,
                              const torch::Tensor& sin, bool inverse) {
    const c10::DeviceGuard guard(x.device());
    torch::Tensor out = torch::empty_like(x);
    const int64_t head_dim = x.size(-1) / heads, tokens = x.numel() / x.size(-1);
    cuda::rotary(x.data_ptr(), out.data_ptr(), cos.data_ptr<float>(), sin.data_ptr<float>(),
                 nullptr, tokens, cos.size(0), heads, head_dim, inverse, dtypeOf(x),
                 currentStream(x.device()));
    return out;
  }
};
#endif

}  // namespace

bool fusedKernelsBuilt() {
#if defined(CXXLAUNCH_HAVE_CUDA_KERNELS)
  return true;
#else
  return false;
#endif
}

namespace detail {

bool fusable(std::initializer_list<const torch::Tensor*> tensors) {
  if (!fusedKernelsBuilt()) return false;
  const torch::Tensor& first = **tensors.begin();
  if (!first.is_cuda() ||
      (first.scalar_type() != torch::kFloat && first.scalar_type() != torch::kBFloat16)) {
    return false;
  }
  for (const auto* t : tensors) {
    if (t->device() != first.device() || t->scalar_type() != first.scalar_type()) return false;
  }
  return true;
}

std::pair<torch::Tensor, torch::Tensor> crossEntropyRows(const torch::Tensor& logits,
                                                         const torch::Tensor& labels) {
#if defined(CXXLAUNCH_HAVE_CUDA_KERNELS)
  const c10::DeviceGuard guard(logits.device());
  const torch::Tensor l = logits.contiguous(), targets = labels.contiguous();
  const int64_t rows = l.size(0), vocab = l.size(1);
  torch::Tensor lse = torch::empty({rows}, l.options().dtype(torch::kFloat));
  torch::Tensor losses = torch::empty({rows}, l.options().dtype(torch::kFloat));
  cuda::crossEntropyForward(l.data_ptr(), targets.data_ptr<int64_t>(), lse.data_ptr<float>(),
                            losses.data_ptr<float>(), rows, vocab, dtypeOf(l),
                            currentStream(l.device()));
  return {lse, losses};
#else
  (void)labels;
  throw InvalidArgument("crossEntropyRows: " + std::string(logits.toString()) +
                        " on a build without the CUDA kernels");
#endif
}

void crossEntropyGradInPlace(torch::Tensor& logits, const torch::Tensor& labels,
                             const torch::Tensor& lse, const torch::Tensor& scale) {
#if defined(CXXLAUNCH_HAVE_CUDA_KERNELS)
  if (!logits.is_contiguous()) throw InvalidArgument("crossEntropyGradInPlace: strided logits");
  const c10::DeviceGuard guard(logits.device());
  const torch::Tensor targets = labels.contiguous(), rows_lse = lse.contiguous(),
                      k = scale.to(torch::kFloat).contiguous();
  cuda::crossEntropyBackward(logits.data_ptr(), targets.data_ptr<int64_t>(),
                             rows_lse.data_ptr<float>(), k.data_ptr<float>(), logits.size(0),
                             logits.size(1), dtypeOf(logits), currentStream(logits.device()));
#else
  (void)labels, (void)lse, (void)scale;
  throw InvalidArgument("crossEntropyGradInPlace: " + std::string(logits.toString()) +
                        " on a build without the CUDA kernels");
#endif
}

}  // namespace detail

torch::Tensor rmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
#if defined(CXXLAUNCH_HAVE_CUDA_KERNELS)
  if (detail::fusable({&x, &weight}) && weight.dim() == 1 && x.size(-1) == weight.size(0)) {
    return RmsNormFunction::apply(x, weight, eps);
  }
#endif
  return unfusedRmsNorm(x, weight, eps);
}

torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up) {
#if defined(CXXLAUNCH_HAVE_CUDA_KERNELS)
  if (detail::fusable({&gate, &up}) && gate.sizes() == up.sizes()) {
    return SwigluFunction::apply(gate, up);
  }
#endif
  return torch::silu(gate) * up;
}

torch::Tensor rotary(const torch::Tensor& x, int64_t heads, const torch::Tensor& cos,
                     const torch::Tensor& sin) {
  const int64_t batch = x.size(0), length = x.size(1), head_dim = x.size(2) / heads;
#if defined(CXXLAUNCH_HAVE_CUDA_KERNELS)
  if (detail::fusable({&x}) && cos.device() == x.device()) {
    const torch::Tensor c = cos.to(torch::kFloat).reshape({-1, head_dim}).contiguous();
    const torch::Tensor s = sin.to(torch::kFloat).reshape({-1, head_dim}).contiguous();
    return RotaryFunction::apply(x, heads, c, s);
  }
#endif
  const torch::Tensor t = x.view({batch, length, heads, head_dim}).transpose(1, 2);
  const torch::Tensor c = cos.to(x.scalar_type()), s = sin.to(x.scalar_type());
  return (t * c + rotateHalf(t) * s).transpose(1, 2).reshape({batch, length, heads * head_dim});
}

}  // namespace cxxlaunch::models
