#include "models/llama.h"

#include <ATen/CPUGeneratorImpl.h>
#include <sys/stat.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/loss.h>

#include <cerrno>
#include <cmath>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <tuple>

#include "common/error.h"
#include "common/file.h"
#include "models/attention.h"
#include "models/fused.h"
#include "models/lora.h"
#include "runtime/deferred_init.h"
#include "runtime/strategy/unit.h"

namespace cxxlaunch::models {
namespace {

using nlohmann::json;

// HF's initialisation (initializer_range 0.02): a model built from scratch starts as one
// transformers would build; a loaded one is overwritten anyway. Each parameter draws its own seed
// from LibTorch's generator as it is built, so that its values are the same whether they are
// made now or when a strategy materialises it (runtime::DeferredInit).
runtime::Initializer normal(double std) {
  uint64_t seed = 0;
  {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    seed = generator.get<at::CPUGeneratorImpl>()->random64();
  }
  return [seed, std](torch::Tensor& values) {
    torch::Tensor cpu = torch::empty(values.sizes(), torch::kFloat);
    cpu.normal_(0.0, std, at::make_generator<at::CPUGeneratorImpl>(seed));
    values.copy_(cpu);
  };
}

runtime::Initializer constant(double value) {
  return [value](torch::Tensor& values) { values.fill_(value); };
}

torch::nn::Linear linear(int64_t in, int64_t out, bool bias) {
  torch::nn::Linear l(torch::nn::LinearOptions(in, out).bias(bias));
  runtime::initParameter(l->weight, normal(0.02));
  if (bias) runtime::initParameter(l->bias, constant(0));
  return l;
}

// The rotary angles position * inv_freq, for fp32 positions of any shape [...]: [..., head_dim]
// (the frequencies twice, as HF's cat((freqs, freqs))).
torch::Tensor rotaryAngles(const LlamaConfig& c, const torch::Tensor& positions) {
  const int64_t dim = c.headDim();
  const torch::Tensor inv_freq =
      1.0 /
      torch::pow(
          c.rope_theta,
          torch::arange(0, dim, 2, positions.options().dtype(torch::kLong)).to(torch::kFloat) /
              static_cast<double>(dim));
  const torch::Tensor freqs = positions.unsqueeze(-1) * inv_freq;
  return torch::cat({freqs, freqs}, -1);
}

}  // namespace

LlamaConfig LlamaConfig::fromJson(const std::string& text, const std::string& origin) {
  // A value of another JSON type than the key's (model_type 7) is refused by the checks below;
  // this is the net under them, so that no library text reaches the user.
  try {
    return fromJsonChecked(text, origin);
  } catch (const json::exception& e) {
    throw InvalidArgument(origin + ": a value has the wrong JSON type (" + e.what() + ")");
  }
}

LlamaConfig LlamaConfig::fromJsonChecked(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw InvalidArgument(origin + " is not JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw InvalidArgument(origin + " is not a JSON object");
  LlamaConfig c;
  if (j.contains("model_type") && !j["model_type"].is_string()) {
    throw InvalidArgument(origin + ": model_type is " + j["model_type"].dump() +
                          ", not a name such as \"llama\"");
  }
  c.model_type = j.value("model_type", std::string());
  if (c.model_type != "llama" && c.model_type != "qwen2" && c.model_type != "mistral") {
    throw InvalidArgument(origin + ": model_type '" + c.model_type +
                          "' is not one of the Llama family this model builds (llama, qwen2, "
                          "mistral)");
  }
  std::string missing;
  auto whole = [&](const char* key, int64_t& out, bool required) {
    if (!j.contains(key)) {
      if (required) missing += std::string(missing.empty() ? "" : ", ") + key;
      return;
    }
    if (!j[key].is_number_integer() || j[key].get<int64_t>() < 1) {
      throw InvalidArgument(origin + ": " + key + " is " + j[key].dump() +
                            ", not a whole number >= 1");
    }
    out = j[key].get<int64_t>();
  };
  auto real = [&](const char* key, double& out) {
    if (!j.contains(key) || j[key].is_null()) return;
    if (!j[key].is_number() || !(j[key].get<double>() > 0) ||
        !std::isfinite(j[key].get<double>())) {
      throw InvalidArgument(origin + ": " + key + " is " + j[key].dump() +
                            ", not a finite number > 0");
    }
    out = j[key].get<double>();
  };
  whole("hidden_size", c.hidden_size, true);
  whole("intermediate_size", c.intermediate_size, true);
  whole("num_hidden_layers", c.num_hidden_layers, true);
  whole("num_attention_heads", c.num_attention_heads, true);
  whole("vocab_size", c.vocab_size, true);
  c.num_key_value_heads = c.num_attention_heads;
  whole("num_key_value_heads", c.num_key_value_heads, false);
  whole("max_position_embeddings", c.max_position_embeddings, false);
  if (!missing.empty()) throw InvalidArgument(origin + " has no " + missing);
  real("rms_norm_eps", c.rms_norm_eps);
  real("rope_theta", c.rope_theta);
  if (j.contains("tie_word_embeddings")) {
    if (!j["tie_word_embeddings"].is_boolean()) {
      throw InvalidArgument(origin + ": tie_word_embeddings is not true or false");
    }
    c.tie_word_embeddings = j["tie_word_embeddings"].get<bool>();
  }
  // Keys that change the math this model does not implement: refused rather than loaded wrong.
  auto unsupported = [&](const char* key, const std::string& why) {
    throw InvalidArgument(origin + ": " + key + " " + j[key].dump() + " " + why +
                          "; this build implements the plain Llama math");
  };
  if (j.contains("hidden_act") && j["hidden_act"] != "silu") {
    unsupported("hidden_act", "is not silu");
  }
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const json& scaling = j["rope_scaling"];
    std::string type;
    for (const char* key : {"type", "rope_type"}) {
      if (scaling.is_object() && scaling.contains(key) && scaling[key].is_string()) {
        type = scaling[key].get<std::string>();
      }
    }
    if (type != "default") {
      unsupported("rope_scaling", "scales the rotary embedding (as Llama 3.1's)");
    }
  }
  if (j.contains("attention_bias") && j["attention_bias"] == true) {
    unsupported("attention_bias", "asks for biases on every attention projection");
  }
  if (j.contains("head_dim") && j["head_dim"].is_number_integer() &&
      j["hidden_size"].get<int64_t>() % c.num_attention_heads == 0 &&
      j["head_dim"].get<int64_t>() != c.headDim()) {
    unsupported("head_dim", "is not hidden_size / num_attention_heads");
  }
  // Mistral's sliding window (Qwen2's when use_sliding_window): the same math for sequences
  // within it, which is what forward accepts.
  const bool windowed = c.model_type == "mistral" ||
                        (j.contains("use_sliding_window") && j["use_sliding_window"] == true);
  if (windowed && j.contains("sliding_window") && !j["sliding_window"].is_null()) {
    whole("sliding_window", c.sliding_window, false);
  }
  if (c.hidden_size % c.num_attention_heads != 0 || c.headDim() % 2 != 0 ||
      c.num_attention_heads % c.num_key_value_heads != 0) {
    throw InvalidArgument(origin +
                          ": the heads do not fit: hidden_size must be num_attention_heads "
                          "times an even head size, and num_attention_heads a multiple of "
                          "num_key_value_heads");
  }
  return c;
}

LlamaConfig LlamaConfig::fromFile(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 && errno == ENOENT) {
    throw InvalidArgument("cannot read '" + path +
                          "': a model folder in Hugging Face's layout has its config.json");
  }
  // Not a FIFO (it would block), a folder, or a file of gigabytes read whole.
  return fromJson(readRegularFile(path, "config", kMaxConfigBytes), path);
}

double LlamaConfig::parameterCount() const {
  const double h = static_cast<double>(hidden_size), v = static_cast<double>(vocab_size);
  const double kv = static_cast<double>(num_key_value_heads) * static_cast<double>(headDim());
  const double bias = attentionBias() ? h + 2 * kv : 0;
  const double layer =
      2 * h * h + 2 * h * kv + bias + 3 * h * static_cast<double>(intermediate_size) + 2 * h;
  return v * h * (tie_word_embeddings ? 1 : 2) + static_cast<double>(num_hidden_layers) * layer + h;
}

std::string LlamaConfig::toJson() const {
  const json j = {{"architectures",
                   {model_type == "qwen2"     ? "Qwen2ForCausalLM"
                    : model_type == "mistral" ? "MistralForCausalLM"
                                              : "LlamaForCausalLM"}},
                  {"model_type", model_type},
                  {"hidden_size", hidden_size},
                  {"intermediate_size", intermediate_size},
                  {"num_hidden_layers", num_hidden_layers},
                  {"num_attention_heads", num_attention_heads},
                  {"num_key_value_heads", num_key_value_heads},
                  {"vocab_size", vocab_size},
                  {"max_position_embeddings", max_position_embeddings},
                  {"rms_norm_eps", rms_norm_eps},
                  {"rope_theta", rope_theta},
                  {"tie_word_embeddings", tie_word_embeddings},
                  {"sliding_window", sliding_window > 0 ? json(sliding_window) : json(nullptr)},
                  {"hidden_act", "silu"}};
  return j.dump(2) + "\n";
}

LlamaRMSNormImpl::LlamaRMSNormImpl(int64_t size, double eps)
    : weight(register_parameter("weight", torch::empty({size}))), eps_(eps) {
  runtime::initParameter(weight, constant(1));
}

torch::Tensor LlamaRMSNormImpl::forward(const torch::Tensor& x) {
  return rmsNorm(x, weight, eps_);  // one fused kernel on a GPU (models/fused.h)
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& c)
    : q_proj(register_module("q_proj", linear(c.hidden_size, c.hidden_size, c.attentionBias()))),
      k_proj(register_module(
          "k_proj", linear(c.hidden_size, c.num_key_value_heads * c.headDim(), c.attentionBias()))),
      v_proj(register_module(
          "v_proj", linear(c.hidden_size, c.num_key_value_heads * c.headDim(), c.attentionBias()))),
      o_proj(register_module("o_proj", linear(c.hidden_size, c.hidden_size, false))),
      heads_(c.num_attention_heads),
      kv_heads_(c.num_key_value_heads),
      head_dim_(c.headDim()) {}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                          const torch::Tensor& sin, const torch::Tensor& masked) {
  const int64_t batch = x.size(0), length = x.size(1);
  auto heads = [&](const torch::Tensor& t, int64_t n) {  // [B, T, n*d] -> [B, n, T, d]
    return t.view({batch, length, n, head_dim_}).transpose(1, 2);
  };
  // The rotary embedding on the projections' outputs as they lie (fused on a GPU, models/fused.h).
  const torch::Tensor q = heads(rotary(linearForward(*q_proj, x), heads_, cos, sin), heads_);
  const torch::Tensor k = heads(rotary(linearForward(*k_proj, x), kv_heads_, cos, sin), kv_heads_);
  const torch::Tensor v = heads(linearForward(*v_proj, x), kv_heads_);
  // Flash / memory-efficient attention where this LibTorch has it, else the math
  // (models/attention.h); each K/V head serves heads_ / kv_heads_ query heads without a copy.
  const torch::Tensor out =
      attention(q, k, v, masked).transpose(1, 2).reshape({batch, length, heads_ * head_dim_});
  return linearForward(*o_proj, out);
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& c)
    : gate_proj(register_module("gate_proj", linear(c.hidden_size, c.intermediate_size, false))),
      up_proj(register_module("up_proj", linear(c.hidden_size, c.intermediate_size, false))),
      down_proj(register_module("down_proj", linear(c.intermediate_size, c.hidden_size, false))) {}

torch::Tensor LlamaMLPImpl::forward(const torch::Tensor& x) {
  return linearForward(*down_proj,
                       swiglu(linearForward(*gate_proj, x), linearForward(*up_proj, x)));
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& c)
    : self_attn(register_module("self_attn", LlamaAttention(c))),
      mlp(register_module("mlp", LlamaMLP(c))),
      input_layernorm(
          register_module("input_layernorm", LlamaRMSNorm(c.hidden_size, c.rms_norm_eps))),
      post_attention_layernorm(register_module("post_attention_layernorm",
                                               LlamaRMSNorm(c.hidden_size, c.rms_norm_eps))) {}

torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                             const torch::Tensor& sin,
                                             const torch::Tensor& masked) {
  const torch::Tensor h = x + self_attn(input_layernorm(x), cos, sin, masked);
  return h + mlp(post_attention_layernorm(h));
}

LlamaEmbeddingImpl::LlamaEmbeddingImpl(int64_t vocab_size, int64_t hidden_size, bool tied)
    : weight(register_parameter("weight", torch::empty({vocab_size, hidden_size}))), tied_(tied) {
  runtime::initParameter(weight, normal(0.02));
}

torch::Tensor LlamaEmbeddingImpl::forward(const torch::Tensor& input_ids) {
  return torch::embedding(weight, input_ids);
}

LlamaLMHeadImpl::LlamaLMHeadImpl(int64_t hidden_size, int64_t vocab_size)
    : weight(register_parameter("weight", torch::empty({vocab_size, hidden_size}))) {
  runtime::initParameter(weight, normal(0.02));
}

torch::Tensor LlamaLMHeadImpl::forward(const torch::Tensor& h) {
  return torch::matmul(h, weight.t());
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& c)
    : embed_tokens(register_module(
          "embed_tokens", LlamaEmbedding(c.vocab_size, c.hidden_size, c.tie_word_embeddings))),
      layers(register_module("layers", torch::nn::ModuleList())),
      norm(register_module("norm", LlamaRMSNorm(c.hidden_size, c.rms_norm_eps))),
      config_(c) {
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    // Qwen2's layers under their own type name: what a Qwen2 config's wrap class names.
    LlamaDecoderLayer layer(c.model_type == "qwen2" ? std::make_shared<Qwen2DecoderLayerImpl>(c)
                                                    : std::make_shared<LlamaDecoderLayerImpl>(c));
    layers->push_back(layer);
    decoder_.push_back(layer);
  }
}

torch::Tensor LlamaModelImpl::forward(const torch::Tensor& input_ids,
                                      const torch::Tensor& attention_mask,
                                      const torch::Tensor& position_ids) {
  if (input_ids.dim() != 2 || input_ids.scalar_type() != torch::kLong) {
    throw InvalidArgument("LlamaModel: input_ids must be int64 of shape [batch, length]");
  }
  const int64_t batch = input_ids.size(0), length = input_ids.size(1);
  if (config_.sliding_window > 0 && length > config_.sliding_window) {
    throw InvalidArgument("LlamaModel: a sequence of " + std::to_string(length) +
                          " tokens is longer than the model's sliding_window " +
                          std::to_string(config_.sliding_window) +
                          ", which this build does not implement; use shorter sequences");
  }
  torch::Tensor cos, sin;
  // What each query must not see besides the future: packed examples' other examples, padding
  // keys. Undefined (the plain causal batch): attention() needs no mask tensor then (the flash
  // kernel). Else the causal part included, [T, T] or [B, 1, T, T].
  torch::Tensor masked;
  auto causal = [&] {
    return torch::ones({length, length},
                       torch::TensorOptions().dtype(torch::kBool).device(input_ids.device()))
        .triu(1);
  };
  if (position_ids.defined()) {
    if (position_ids.sizes() != input_ids.sizes() || position_ids.scalar_type() != torch::kLong) {
      throw InvalidArgument(
          "LlamaModel: position_ids must be int64 of input_ids' shape [batch, length]");
    }
    const torch::Tensor positions = position_ids.to(input_ids.device());
    // The cached tables' rows at each token's position: one read of the range (a GPU sync).
    const torch::Tensor range = torch::stack({positions.min(), positions.max()}).cpu();
    if (range[0].item<int64_t>() < 0) {
      throw InvalidArgument("LlamaModel: position_ids must be >= 0");
    }
    std::tie(cos, sin) = rotary(range[1].item<int64_t>() + 1, input_ids.device());
    // One table per row, [B, 1, T, head_dim].
    const torch::Tensor flat = positions.reshape({-1});
    cos = cos.index_select(0, flat).view({batch, 1, length, -1});
    sin = sin.index_select(0, flat).view({batch, 1, length, -1});
    // Packed examples (HF's padding-free convention): an example starts wherever its position is
    // 0, and a query sees only the keys of its own example. Segment ids by a running count of the
    // starts: one comparison per query-key pair, no loop over examples.
    const torch::Tensor segment = (positions == 0).cumsum(1);
    const torch::Tensor other = segment.unsqueeze(2) != segment.unsqueeze(1);  // [B, T, T]
    masked = (causal().unsqueeze(0) | other).view({batch, 1, length, length});
  } else {
    std::tie(cos, sin) = rotary(length, input_ids.device());
    cos = cos.narrow(0, 0, length);
    sin = sin.narrow(0, 0, length);
  }
  if (attention_mask.defined()) {
    if (attention_mask.sizes() != input_ids.sizes()) {
      throw InvalidArgument(
          "LlamaModel: attention_mask must have input_ids' shape [batch, length]");
    }
    const torch::Tensor padding = (attention_mask == 0).to(input_ids.device());
    if (!masked.defined()) masked = causal();
    masked = masked.dim() == 2 ? masked.unsqueeze(0) : masked.squeeze(1);
    masked = (masked | padding.view({batch, 1, length})).unsqueeze(1);
  }
  torch::Tensor h = runtime::unitForward(embed_tokens, input_ids);
  for (auto& layer : decoder_) h = runtime::unitForward(layer, h, cos, sin, masked);
  return norm(h);
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& c)
    : model(register_module("model", LlamaModel(c))), config_(c) {
  if (!c.tie_word_embeddings) {
    lm_head = register_module("lm_head", LlamaLMHead(c.hidden_size, c.vocab_size));
  }
}

torch::Tensor LlamaForCausalLMImpl::forward(const torch::Tensor& input_ids,
                                            const torch::Tensor& attention_mask,
                                            const torch::Tensor& position_ids) {
  const torch::Tensor h = model(input_ids, attention_mask, position_ids);
  return lm_head ? runtime::unitForward(lm_head, h)
                 : torch::matmul(h, model->embed_tokens->weight.t());
}

std::pair<torch::Tensor, torch::Tensor> LlamaModelImpl::rotary(int64_t positions,
                                                               const torch::Device& device) {
  std::lock_guard<std::mutex> lock(rotary_mutex_);
  if (!rotary_cos_.defined() || rotary_cos_.device() != device || rotary_cos_.size(0) < positions) {
    // Grown to a power of two, so that lengths that creep up rebuild it a few times at most.
    int64_t rows = 64;
    while (rows < positions) rows *= 2;
    torch::NoGradGuard no_grad;
    std::tie(rotary_cos_, rotary_sin_) = rotaryTables(config_, rows, device);
  }
  return {rotary_cos_, rotary_sin_};
}

std::pair<torch::Tensor, torch::Tensor> rotaryTables(const LlamaConfig& c, int64_t length,
                                                     const torch::Device& device) {
  const torch::Tensor positions =
      torch::arange(length, torch::TensorOptions().dtype(torch::kFloat).device(device));
  const torch::Tensor emb = rotaryAngles(c, positions);
  return {emb.cos(), emb.sin()};
}

std::pair<torch::Tensor, torch::Tensor> rotaryTables(const LlamaConfig& c,
                                                     const torch::Tensor& position_ids) {
  // [B, T] -> [B, 1, T, head_dim]: one table per row, broadcast over the heads. Each angle is the
  // same fp32 product as the [T] form's, so a packed example's tables equal its own run's.
  const torch::Tensor emb = rotaryAngles(c, position_ids.to(torch::kFloat));
  return {emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)};
}

torch::Tensor causalLmLoss(const torch::Tensor& logits, const torch::Tensor& labels) {
  const int64_t length = logits.size(1);
  const torch::Tensor shifted = logits.narrow(1, 0, length - 1).to(torch::kFloat);
  const torch::Tensor targets = labels.narrow(1, 1, length - 1);
  return torch::nn::functional::cross_entropy(
      shifted.reshape({-1, shifted.size(-1)}), targets.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
}

}  // namespace cxxlaunch::models
