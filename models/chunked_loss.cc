#include "models/chunked_loss.h"

#include <torch/autograd.h>
#include <torch/torch.h>

#include <algorithm>
#include <sstream>
#include <utility>

#include "common/error.h"
#include "models/fused.h"
#include "runtime/precision/policy.h"
#include "runtime/strategy/unit_registry.h"

namespace cxxlaunch::models {
namespace {

constexpr int64_t kIgnoreIndex = -100;

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// What the chunks' matmuls run in: autocast's dtype where it is on (as the plain lm_head's linear
// under mixed precision), else the inputs'.
c10::ScalarType computeDtype(const torch::Tensor& hidden, const torch::Tensor& weight) {
  const c10::DeviceType device = hidden.device().type();
  if (runtime::autocastEnabled(device)) return runtime::autocastDtype(device);
  return c10::promoteTypes(hidden.scalar_type(), weight.scalar_type());
}

// hidden [N, H], weight [V, H], labels [N]: every label in [0, V) (the ignored ones are dropped
// before). Saves the inputs and each token's logsumexp, never a chunk's logits.
class ChunkedCrossEntropyFunction : public torch::autograd::Function<ChunkedCrossEntropyFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& labels,
                               int64_t chunk) {
    const c10::ScalarType dtype = computeDtype(hidden, weight);
    const torch::Tensor h = hidden.to(dtype).contiguous();
    const torch::Tensor w = weight.to(dtype);
    const int64_t n = h.size(0);
    const auto f32 = h.options().dtype(torch::kFloat);
    torch::Tensor lse = torch::empty({n}, f32);
    torch::Tensor total = torch::zeros({}, f32);
    // On a GPU: the logits stay in the compute dtype, one kernel reads them once (models/fused.h).
    const bool fused = detail::fusable({&h, &w});
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t size = std::min(chunk, n - start);
      const torch::Tensor chunk_labels = labels.narrow(0, start, size);
      const torch::Tensor logits = torch::matmul(h.narrow(0, start, size), w.t());
      if (fused) {
        const auto [chunk_lse, losses] = detail::crossEntropyRows(logits, chunk_labels);
        lse.narrow(0, start, size).copy_(chunk_lse);
        total.add_(losses.sum());
        continue;
      }
      const torch::Tensor logits32 = logits.to(torch::kFloat);
      const torch::Tensor chunk_lse = torch::logsumexp(logits32, 1);
      lse.narrow(0, start, size).copy_(chunk_lse);
      const torch::Tensor target = logits32.gather(1, chunk_labels.unsqueeze(1)).squeeze(1);
      total.add_((chunk_lse - target).sum());
    }
    ctx->save_for_backward({hidden, weight, labels, lse});
    ctx->saved_data["dtype"] = static_cast<int64_t>(dtype);
    ctx->saved_data["chunk"] = chunk;
    // No tokens: 0 / 0, nan, as PyTorch's mean cross-entropy over nothing.
    return total.div(static_cast<double>(n));
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const tensor_list saved = ctx->get_saved_variables();
    const torch::Tensor &hidden = saved[0], &weight = saved[1], &labels = saved[2], &lse = saved[3];
    const auto dtype = static_cast<c10::ScalarType>(ctx->saved_data["dtype"].toInt());
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const bool want_hidden = ctx->needs_input_grad(0), want_weight = ctx->needs_input_grad(1);
    const torch::Tensor h = hidden.to(dtype).contiguous();
    const torch::Tensor w = weight.to(dtype);
    const int64_t n = h.size(0);
    const auto f32 = h.options().dtype(torch::kFloat);

    torch::Tensor grad_hidden, grad_weight;
    if (want_hidden) grad_hidden = torch::empty({n, h.size(1)}, h.options());
    // Summed over the chunks in fp32 whatever the compute dtype.
    if (want_weight) grad_weight = torch::zeros(w.sizes(), f32);
    if (n > 0 && (want_hidden || want_weight)) {
      const torch::Tensor scale = grad_outputs[0].to(torch::kFloat) / static_cast<double>(n);
      const bool fused = detail::fusable({&h, &w});
      for (int64_t start = 0; start < n; start += chunk) {
        const int64_t size = std::min(chunk, n - start);
        const torch::Tensor h_chunk = h.narrow(0, start, size);
        // d loss / d logits = (softmax - onehot(label)) * scale, made in the logits' buffer (on a
        // GPU by one kernel, in the compute dtype: no fp32 chunk).
        torch::Tensor g = torch::matmul(h_chunk, w.t());
        if (fused) {
          detail::crossEntropyGradInPlace(g, labels.narrow(0, start, size),
                                          lse.narrow(0, start, size), scale.reshape({1}));
        } else {
          torch::Tensor grad_logits = g.to(torch::kFloat);
          grad_logits.sub_(lse.narrow(0, start, size).unsqueeze(1)).exp_();
          grad_logits.scatter_add_(1, labels.narrow(0, start, size).unsqueeze(1),
                                   torch::full({size, 1}, -1.0, f32));
          grad_logits.mul_(scale);
          g = grad_logits.to(dtype);
        }
        if (want_hidden) {
          torch::Tensor rows = grad_hidden.narrow(0, start, size);
          torch::mm_out(rows, g, w);
        }
        if (want_weight) {
          if (dtype == torch::kFloat) {
            grad_weight.addmm_(g.t(), h_chunk);
          } else {
            grad_weight.add_(torch::mm(g.t(), h_chunk));
          }
        }
      }
    }
    if (want_hidden) grad_hidden = grad_hidden.to(hidden.scalar_type());
    if (want_weight) grad_weight = grad_weight.to(weight.scalar_type());
    return {grad_hidden, grad_weight, torch::Tensor(), torch::Tensor()};
  }
};

// The tokens whose label counts, [n, H] and [n]: causalLmLoss's mean is over them only.
struct Counted {
  torch::Tensor hidden, labels;
};

Counted counted(const torch::Tensor& hidden, const torch::Tensor& labels, int64_t vocab) {
  const torch::Tensor kept = labels != kIgnoreIndex;
  const torch::Tensor outside = kept & ((labels < 0) | (labels >= vocab));
  if (outside.any().item<bool>()) {
    const int64_t at = outside.nonzero()[0][0].item<int64_t>();
    std::ostringstream message;
    message << "label " << labels[at].item<int64_t>() << " (token " << at
            << ") is outside the vocabulary [0, " << vocab << "): give token ids below " << vocab
            << ", or -100 for a token the loss ignores";
    throw InvalidArgument(message.str());
  }
  const torch::Tensor index = kept.nonzero().squeeze(1);
  if (index.size(0) == labels.size(0)) return {hidden, labels};
  return {hidden.index_select(0, index), labels.index_select(0, index)};
}

// weight: [V, H] (the head's shape, which a sharded head's tensor has not before its gather).
void checkShapes(const torch::Tensor& hidden, c10::IntArrayRef weight,
                 const torch::Tensor& labels) {
  if (hidden.dim() != 2 || weight.size() != 2 || labels.dim() != 1 || hidden.size(1) != weight[1] ||
      labels.size(0) != hidden.size(0)) {
    std::ostringstream message;
    message << "chunked cross-entropy wants hidden [N, H], weight [V, H] and labels [N]; got "
            << hidden.sizes() << ", " << weight << " and " << labels.sizes();
    throw InvalidArgument(message.str());
  }
  if (labels.scalar_type() != torch::kLong) {
    throw InvalidArgument("chunked cross-entropy wants int64 labels, got " +
                          std::string(c10::toString(labels.scalar_type())));
  }
}

// HF's shift: hidden at t predicts the label at t + 1.
std::pair<torch::Tensor, torch::Tensor> shifted(const torch::Tensor& hidden,
                                                const torch::Tensor& labels) {
  if (hidden.dim() != 3 || labels.dim() != 2 || labels.size(0) != hidden.size(0) ||
      labels.size(1) != hidden.size(1)) {
    std::ostringstream message;
    message << "the causal-LM loss wants hidden states [B, T, H] and labels [B, T]; got "
            << hidden.sizes() << " and " << labels.sizes();
    throw InvalidArgument(message.str());
  }
  const int64_t length = hidden.size(1);
  return {hidden.narrow(1, 0, length - 1).reshape({-1, hidden.size(2)}),
          labels.narrow(1, 1, length - 1).reshape({-1})};
}

}  // namespace

int64_t chunkTokens(int64_t vocab_size, const ChunkedLossOptions& options) {
  if (options.chunk_tokens > 0) return options.chunk_tokens;
  const int64_t row = std::max<int64_t>(vocab_size, 1) * static_cast<int64_t>(sizeof(float));
  return std::max<int64_t>(options.chunk_bytes / row, 1);
}

torch::Tensor chunkedCrossEntropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                  const torch::Tensor& labels, const ChunkedLossOptions& options) {
  checkShapes(hidden, weight.sizes(), labels);
  const Counted c = counted(hidden, labels, weight.size(0));
  return ChunkedCrossEntropyFunction::apply(c.hidden, weight, c.labels,
                                            chunkTokens(weight.size(0), options));
}

torch::Tensor chunkedCausalLmLoss(const torch::Tensor& hidden, const torch::Tensor& weight,
                                  const torch::Tensor& labels, const ChunkedLossOptions& options) {
  const auto [h, l] = shifted(hidden, labels);
  return chunkedCrossEntropy(h, weight, l, options);
}

torch::Tensor chunkedCausalLmLoss(LlamaForCausalLM& model, const torch::Tensor& input_ids,
                                  const torch::Tensor& labels, const torch::Tensor& attention_mask,
                                  const ChunkedLossOptions& options) {
  return chunkedCausalLmLoss(model, input_ids, labels, attention_mask, torch::Tensor(), options);
}

torch::Tensor chunkedCausalLmLoss(LlamaForCausalLM& model, const torch::Tensor& input_ids,
                                  const torch::Tensor& labels, const torch::Tensor& attention_mask,
                                  const torch::Tensor& position_ids,
                                  const ChunkedLossOptions& options) {
  const torch::Tensor hidden = model->model(input_ids, attention_mask, position_ids);
  if (!model->lm_head) {
    return chunkedCausalLmLoss(hidden, model->model->embed_tokens->weight, labels, options);
  }
  // What unitForward does around lm_head's forward: the head is gathered for the loss and again
  // (a hook on the loss) before its backward.
  const auto [h, l] = shifted(hidden, labels);
  const torch::nn::Module& head = *model->lm_head.ptr();
  runtime::UnitHooks* hooks = runtime::detail::unitHooksFor(&head);
  if (hooks == nullptr) return chunkedCrossEntropy(h, model->lm_head->weight, l, options);
  const int64_t vocab = model->config().vocab_size;
  checkShapes(h, {vocab, model->config().hidden_size}, l);
  const Counted c = counted(h, l, vocab);  // before the gather: a bad label leaves nothing held
  hooks->beforeForward(head);
  torch::Tensor loss = ChunkedCrossEntropyFunction::apply(c.hidden, model->lm_head->weight,
                                                          c.labels, chunkTokens(vocab, options));
  return hooks->afterForward(head, std::move(loss));
}

}  // namespace cxxlaunch::models
