#pragma once
// The Llama family (Llama, Qwen2, Mistral) as Hugging Face's transformers defines it: the same
// parameter names (`model.layers.3.self_attn.q_proj.weight`, ...), so an HF model folder loads by
// name (Accelerator::loadModel) and an export loads back into transformers, and the same math
// (RMSNorm in fp32, rotary embeddings with rotate_half, grouped-query attention, a causal mask,
// softmax in fp32, a SwiGLU MLP; the attention through flash kernels where the LibTorch built
// against has them, models/attention.h), checked against an independent plain-PyTorch forward
// (tests/models/llama_reference.py).
//
//   auto config = cxxlaunch::models::LlamaConfig::fromFile(dir + "/config.json");
//   cxxlaunch::models::LlamaForCausalLM model(config);
//   acc.prepare(model.ptr(), optimizer);
//   acc.loadModel(dir);                                 // each rank reads its shards' bytes
//   auto logits = model(input_ids);                     // [B, T] int64 -> [B, T, vocab]
//   auto packed = model->forward(input_ids, {}, position_ids);   // rows of packed examples
//   acc.backward(cxxlaunch::models::causalLmLoss(logits, labels));
//
// The decoder layers run through unitForward (runtime/strategy/unit.h) themselves: their type
// names, LlamaDecoderLayer and Qwen2DecoderLayer, are what a config's
// fsdp_transformer_layer_cls_to_wrap names, and ZeRO-3 / FULL_SHARD gathers them in time with no
// more from the trainer.
//
// Built inside Accelerator::deferredInit() (the config's zero3_init_flag or
// fsdp_cpu_ram_efficient_loading), the parameters take no memory until prepare makes them, one
// unit at a time under ZeRO-3 / FULL_SHARD: no rank holds the model whole (DeferredInit,
// runtime/strategy/unit.h). Each parameter's initial values come from a seed it draws as it is
// built, so a model is the same built either way.
//
// The projections compute through linearForward (models/lora.h), which adds a LoRA adapter's
// term where addLora put one.
//
// Thread-safety: as any LibTorch module.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/strategy/unit.h"

namespace cxxlaunch::models {

// An HF config.json's keys that the architecture needs.
struct LlamaConfig {
  std::string model_type = "llama";  // llama | qwen2 | mistral
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // config.json without it: num_attention_heads (as HF)
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  // Mistral's (Qwen2's, with use_sliding_window): 0 for none. Sequences longer than the window
  // are refused (the windowed mask is not implemented); within it the math is the same.
  int64_t sliding_window = 0;

  // Qwen2's q/k/v projections have biases; Llama's and Mistral's do not.
  bool attentionBias() const { return model_type == "qwen2"; }
  int64_t headDim() const { return hidden_size / num_attention_heads; }

  // Throws InvalidArgument naming the file: no such file, not JSON, another architecture, keys
  // missing (all of them listed) or inconsistent (heads that do not divide the hidden size), or
  // asking for math this model does not do (hidden_act other than silu, rope_scaling,
  // attention_bias, a head_dim of its own).
  // The file is opened as common/file.h's openRegularFile does: a FIFO, a directory or a file
  // over kMaxConfigBytes is refused, naming the path.
  static LlamaConfig fromFile(const std::string& path);
  static LlamaConfig fromJson(const std::string& text, const std::string& origin = "config.json");
  // Hugging Face's config.json files are a few KiB; 16 MiB leaves room for large label maps.
  static constexpr size_t kMaxConfigBytes = size_t{16} << 20;
  // How many parameters the architecture has (the embedding, the layers, the norms, lm_head
  // unless tied), as a double: a config's sizes can describe more than an int64 counts, and
  // callers bound it (by what the weights hold, or by memory) before building anything.
  double parameterCount() const;
  // As an HF config.json (what an export writes beside its weights).
  std::string toJson() const;

 private:
  static LlamaConfig fromJsonChecked(const std::string& text, const std::string& origin);
};

// x * rsqrt(mean(x^2) + eps) in fp32, times the weight, in the input's dtype.
class LlamaRMSNormImpl : public torch::nn::Module {
 public:
  LlamaRMSNormImpl(int64_t size, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(LlamaRMSNorm);

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  explicit LlamaAttentionImpl(const LlamaConfig& config);
  // x [B, T, hidden]; cos and sin [T, head_dim] or, per row, [B, 1, T, head_dim] (rotaryTables);
  // `masked`: true where a query must not see a key, [T, T] or [B, 1, T, T]; undefined: the
  // plain causal mask (models/attention.h).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& masked);
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  int64_t heads_, kv_heads_, head_dim_;
};
TORCH_MODULE(LlamaAttention);

class LlamaMLPImpl : public torch::nn::Module {
 public:
  explicit LlamaMLPImpl(const LlamaConfig& config);
  torch::Tensor forward(const torch::Tensor& x);  // down(silu(gate(x)) * up(x))
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LlamaMLP);

// Runs through unitForward wherever it is used (LlamaModel's forward does it), so as a shard
// unit it rests sharded from prepare on.
class LlamaDecoderLayerImpl : public torch::nn::Module, public runtime::RunsThroughUnitForward {
 public:
  explicit LlamaDecoderLayerImpl(const LlamaConfig& config);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& masked);
  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};
  LlamaRMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(LlamaDecoderLayer);

// The same layer under Qwen2's type name, for configs that wrap `Qwen2DecoderLayer`.
class Qwen2DecoderLayerImpl : public LlamaDecoderLayerImpl {
 public:
  using LlamaDecoderLayerImpl::LlamaDecoderLayerImpl;
};

// The token embedding (HF's `embed_tokens`, weight [vocab, hidden]). Untied from the output layer
// it runs through unitForward (LlamaModel's forward does it) as a shard unit of its own: under
// ZeRO-3 it rests sharded, as DeepSpeed partitions every parameter. Tied, its weight is used
// twice per forward and it stays whole.
class LlamaEmbeddingImpl : public torch::nn::Module, public runtime::RunsThroughUnitForward {
 public:
  LlamaEmbeddingImpl(int64_t vocab_size, int64_t hidden_size, bool tied);
  torch::Tensor forward(const torch::Tensor& input_ids);  // [B, T] -> [B, T, hidden]
  bool runsThroughUnitForward() const override { return !tied_; }
  torch::Tensor weight;

 private:
  bool tied_;
};
TORCH_MODULE(LlamaEmbedding);

// The output layer (HF's `lm_head`, no bias): logits = h weight^T. Runs through unitForward
// (LlamaForCausalLM's forward does it): under ZeRO-3 a shard unit of its own, sharded at rest.
class LlamaLMHeadImpl : public torch::nn::Module, public runtime::RunsThroughUnitForward {
 public:
  LlamaLMHeadImpl(int64_t hidden_size, int64_t vocab_size);
  torch::Tensor forward(const torch::Tensor& h);  // [B, T, hidden] -> [B, T, vocab]
  torch::Tensor weight;
};
TORCH_MODULE(LlamaLMHead);

// The embedding, the decoder layers and the final norm (HF's `model.`).
class LlamaModelImpl : public torch::nn::Module {
 public:
  explicit LlamaModelImpl(const LlamaConfig& config);
  // [B, T] -> hidden states [B, T, H]; attention_mask and position_ids as LlamaForCausalLM's.
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {},
                        const torch::Tensor& position_ids = {});
  LlamaEmbedding embed_tokens{nullptr};
  torch::nn::ModuleList layers;
  LlamaRMSNorm norm{nullptr};

 private:
  // cos and sin for positions 0..N-1 with N >= positions, [N, head_dim] fp32 on `device`: the
  // rotary tables, built once (again for a longer sequence or another device), not per forward.
  std::pair<torch::Tensor, torch::Tensor> rotary(int64_t positions, const torch::Device& device);

  LlamaConfig config_;
  std::vector<LlamaDecoderLayer> decoder_;  // the layers, as holders unitForward takes
  std::mutex rotary_mutex_;
  torch::Tensor rotary_cos_, rotary_sin_;
};
TORCH_MODULE(LlamaModel);

class LlamaForCausalLMImpl : public torch::nn::Module {
 public:
  explicit LlamaForCausalLMImpl(const LlamaConfig& config);
  // [B, T] int64 -> logits [B, T, V]. attention_mask (optional, HF's): [B, T], 1 for tokens,
  // 0 for padding, which no query attends to (left or right padding; positions stay 0..T-1).
  // position_ids (optional): [B, T] int64, each token's rotary position; undefined means 0..T-1
  // in every row. Given, they also say where packed examples start, as HF's padding-free
  // batches do: a new example begins at every position 0, and a query attends only to the keys
  // of its own example at or before it (a block-diagonal causal mask). Rows of examples packed
  // so (text/packing.h) train as the examples would one by one: the same loss and gradients, to
  // rounding, when each example's first label is -100.
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {},
                        const torch::Tensor& position_ids = {});
  const LlamaConfig& config() const { return config_; }
  LlamaModel model{nullptr};
  LlamaLMHead lm_head{nullptr};  // null when tie_word_embeddings: embed_tokens' weight

 private:
  LlamaConfig config_;
};
TORCH_MODULE(LlamaForCausalLM);

// cos and sin of the rotary embedding for positions 0..length-1: [length, head_dim], fp32.
std::pair<torch::Tensor, torch::Tensor> rotaryTables(const LlamaConfig& config, int64_t length,
                                                     const torch::Device& device);
// The same at each row's own positions, position_ids [B, T] (any integer or floating dtype):
// [B, 1, T, head_dim], fp32, on position_ids' device.
std::pair<torch::Tensor, torch::Tensor> rotaryTables(const LlamaConfig& config,
                                                     const torch::Tensor& position_ids);

// HF's causal-LM loss: logits [B, T, V] at position t predict labels [B, T] at t + 1; labels
// -100 are ignored; the mean over the rest, in fp32.
torch::Tensor causalLmLoss(const torch::Tensor& logits, const torch::Tensor& labels);

}  // namespace cxxlaunch::models
