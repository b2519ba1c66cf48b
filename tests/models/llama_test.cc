// models/llama.h: HF's config keys, HF's parameter names, and HF's math, the last against an
// independent forward in plain PyTorch (llama_reference.py: Debian's python3-torch, no
// transformers) on the same weights and tokens; and the model's layers as ZeRO-3 units.

#include "models/llama.h"

#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

#include "common/error.h"
#include "runtime/accelerator.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/world.h"
#include "support/ranks.h"
#include "support/subprocess.h"

using namespace cxxlaunch;
using namespace cxxlaunch::models;
using cxxlaunch::testing::onRanks;
namespace fs = std::filesystem;

namespace {

LlamaConfig small(const std::string& type, int64_t kv_heads, bool tied) {
  LlamaConfig c;
  c.model_type = type;
  c.hidden_size = 32;
  c.intermediate_size = 56;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = kv_heads;
  c.vocab_size = 50;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.tie_word_embeddings = tied;
  return c;
}

torch::Tensor tokens(const LlamaConfig& c) {
  return torch::randint(c.vocab_size, {2, 7}, at::detail::createCPUGenerator(3));
}

// A world-2 Accelerator over the Fake backend for rank `r`, the strategy `strategy`.
std::unique_ptr<runtime::Accelerator> rankAccelerator(
    const std::shared_ptr<runtime::FakeWorld>& fake, int r, const std::string& strategy,
    bool init_flag) {
  runtime::World world;
  world.env.rank = r;
  world.env.world_size = 2;
  world.env.strategy = strategy;
  world.env.fsdp_auto_wrap_policy = runtime::WrapPolicy::kTransformerBased;
  world.env.fsdp_transformer_layer_cls = {"LlamaDecoderLayer"};
  world.env.zero3_init_flag = init_flag;
  world.backend = runtime::makeFakeBackend(fake, r);
  return std::make_unique<runtime::Accelerator>(std::move(world), runtime::AcceleratorOptions{});
}

size_t parameterBytes(torch::nn::Module& model) {
  size_t bytes = 0;
  for (const auto& p : model.parameters()) bytes += p.storage().nbytes();
  return bytes;
}

// Bytes this process has read through read(2)/pread(2) so far (/proc/self/io's rchar).
int64_t bytesRead() {
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (io >> key >> value) {
    if (key == "rchar:") return value;
  }
  FAIL("no rchar in /proc/self/io");
  return 0;
}

}  // namespace

TEST_CASE("A config.json reads as HF writes it, and what does not fit is one clear error",
          "[models]") {
  const auto c = LlamaConfig::fromJson(R"({"model_type": "qwen2", "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 8,
      "num_key_value_heads": 2, "vocab_size": 100, "rms_norm_eps": 1e-06,
      "rope_theta": 1000000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16"})");
  CHECK(c.model_type == "qwen2");
  CHECK(c.attentionBias());
  CHECK(c.headDim() == 8);
  CHECK(c.num_key_value_heads == 2);
  CHECK(c.rope_theta == 1e6);
  CHECK(c.tie_word_embeddings);
  CHECK(LlamaConfig::fromJson(c.toJson()).toJson() == c.toJson());
  CHECK(LlamaConfig::fromJson(R"({"model_type": "llama", "hidden_size": 8, "intermediate_size": 8,
      "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 5})")
            .num_key_value_heads == 2);  // absent: as many as the attention heads, as HF
  CHECK_THROWS_WITH(LlamaConfig::fromJson(R"({"model_type": "gpt2", "hidden_size": 8})"),
                    Catch::Contains("model_type 'gpt2' is not one of the Llama family"));
  CHECK_THROWS_WITH(LlamaConfig::fromJson(R"({"model_type": "llama", "hidden_size": 8})"),
                    Catch::Contains("has no intermediate_size, num_hidden_layers, "
                                    "num_attention_heads, vocab_size"));
  CHECK_THROWS_WITH(LlamaConfig::fromJson(R"({"model_type": "llama", "hidden_size": 10,
      "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 4,
      "vocab_size": 5})"),
                    Catch::Contains("the heads do not fit"));
  CHECK_THROWS_WITH(LlamaConfig::fromFile("/nonexistent/config.json"),
                    Catch::Contains("has its config.json"));
  // A value of the wrong JSON type: one line naming the key, never the JSON library's text.
  CHECK_THROWS_WITH(LlamaConfig::fromJson(R"({"model_type": 7, "hidden_size": 8})"),
                    Catch::Contains("model_type is 7, not a name such as \"llama\""));
  const std::string sized = R"({"model_type": "llama", "hidden_size": 8, "intermediate_size": 8,
      "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 5)";
  CHECK_NOTHROW(LlamaConfig::fromJson(sized + R"(, "use_sliding_window": "yes"})"));
  CHECK_THROWS_WITH(LlamaConfig::fromJson(sized + R"(, "rope_scaling": {"type": 3}})"),
                    Catch::Contains("rope_scaling {\"type\":3} scales the rotary embedding") &&
                        !Catch::Contains("json.exception"));
  // config.json read as every named file is: a folder or an oversized file is said to be one.
  cxxlaunch::testing::TempDir dir;
  fs::create_directory(dir.path() + "/config.json");
  CHECK_THROWS_WITH(LlamaConfig::fromFile(dir.path() + "/config.json"),
                    Catch::Contains("is a directory"));
  std::ofstream(dir.path() + "/big.json") << std::string(LlamaConfig::kMaxConfigBytes + 1, ' ');
  CHECK_THROWS_WITH(LlamaConfig::fromFile(dir.path() + "/big.json"),
                    Catch::Contains("more than the 16777216"));
  // Math this model does not do is refused, not loaded wrong.
  const std::string base = R"({"model_type": "llama", "hidden_size": 8, "intermediate_size": 8,
      "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 5)";
  for (const auto& [extra, said] : std::vector<std::pair<std::string, std::string>>{
           {R"("hidden_act": "gelu")", "hidden_act \"gelu\" is not silu"},
           {R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})", "rope_scaling"},
           {R"("attention_bias": true)", "attention_bias true"},
           {R"("head_dim": 8)", "head_dim 8 is not hidden_size / num_attention_heads"}}) {
    CHECK_THROWS_WITH(LlamaConfig::fromJson(base + ", " + extra + "}"), Catch::Contains(said));
  }
  CHECK(LlamaConfig::fromJson(base + R"(, "rope_scaling": null, "attention_bias": false,
      "hidden_act": "silu", "head_dim": 4})")
            .headDim() == 4);
  const auto mistral = LlamaConfig::fromJson(
      R"({"model_type": "mistral", "hidden_size": 8, "intermediate_size": 8,
      "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 5, "sliding_window": 4})");
  CHECK(mistral.sliding_window == 4);
  CHECK_THROWS_WITH(LlamaForCausalLM(mistral)(torch::zeros({1, 5}, torch::kLong)),
                    Catch::Contains("longer than the model's sliding_window 4"));
}

TEST_CASE("parameterCount is the number of parameters the model builds", "[models]") {
  for (const bool tied : {false, true}) {
    for (const char* type : {"llama", "qwen2"}) {
      INFO(type << (tied ? " tied" : ""));
      const LlamaConfig config = small(type, 2, tied);
      LlamaForCausalLM model(config);
      int64_t numel = 0;
      for (const auto& p : model->parameters()) numel += p.numel();
      CHECK(config.parameterCount() == static_cast<double>(numel));
    }
  }
  // Sizes no int64 product holds still count, for the callers to refuse.
  LlamaConfig huge = small("llama", 2, false);
  huge.vocab_size = int64_t{1} << 62;
  CHECK(huge.parameterCount() > 1e20);
}

TEST_CASE("The parameters have Hugging Face's names", "[models]") {
  LlamaForCausalLM qwen(small("qwen2", 2, /*tied=*/false));
  std::vector<std::string> names;
  for (const auto& item : qwen->named_parameters()) names.push_back(item.key());
  std::vector<std::string> expected = {"model.embed_tokens.weight"};
  for (const std::string layer : {"model.layers.0.", "model.layers.1."}) {
    for (const std::string p : {"q", "k", "v"}) {
      expected.push_back(layer + "self_attn." + p + "_proj.weight");
      expected.push_back(layer + "self_attn." + p + "_proj.bias");
    }
    expected.push_back(layer + "self_attn.o_proj.weight");
    for (const std::string p : {"gate", "up", "down"}) {
      expected.push_back(layer + "mlp." + p + "_proj.weight");
    }
    expected.push_back(layer + "input_layernorm.weight");
    expected.push_back(layer + "post_attention_layernorm.weight");
  }
  expected.push_back("model.norm.weight");
  expected.push_back("lm_head.weight");
  CHECK(names == expected);
  CHECK(qwen->model->layers[0]->name().find("Qwen2DecoderLayer") != std::string::npos);
  LlamaForCausalLM tied(small("llama", 4, /*tied=*/true));
  CHECK(tied->named_parameters().find("lm_head.weight") == nullptr);
  CHECK(tied->model->layers[0]->name().find("LlamaDecoderLayer") != std::string::npos);
}

TEST_CASE("Logits and loss equal an independent plain-PyTorch forward of HF's math", "[models]") {
  cxxlaunch::testing::TempDir dir;
  struct Case {
    std::string type;
    int64_t kv_heads;
    bool tied;
  };
  // Grouped-query attention, Qwen2's biases with tied embeddings, plain multi-head attention.
  for (const Case& c :
       {Case{"llama", 2, false}, Case{"qwen2", 1, true}, Case{"mistral", 4, false}}) {
    INFO(c.type << " kv_heads " << c.kv_heads << " tied " << c.tied);
    const LlamaConfig config = small(c.type, c.kv_heads, c.tied);
    torch::manual_seed(7);
    LlamaForCausalLM model(config);
    const torch::Tensor ids = tokens(config);
    torch::Tensor labels = ids.clone();
    labels[0][2] = -100;
    labels[1][5] = -100;
    const torch::Tensor logits = model(ids);
    const torch::Tensor loss = causalLmLoss(logits, labels);
    REQUIRE(logits.sizes() == torch::IntArrayRef({2, 7, config.vocab_size}));
    std::vector<std::pair<std::string, torch::Tensor>> tensors;
    for (const auto& item : model->named_parameters()) {
      tensors.emplace_back(item.key(), item.value().detach());
    }
    tensors.emplace_back("input_ids", ids);
    tensors.emplace_back("labels", labels);
    tensors.emplace_back("loss", loss.detach().reshape({1}));
    const std::string config_path = dir.path() + "/" + c.type + ".json";
    std::ofstream(config_path) << config.toJson();
    auto check = [&](const torch::Tensor& ours) {
      const std::string path = dir.path() + "/" + c.type + ".safetensors";
      auto all = tensors;
      all.emplace_back("logits", ours.detach());
      runtime::checkpoint::writeSafetensorsFile(path, all);
      return cxxlaunch::testing::run({SYSTEM_PYTHON, LLAMA_REFERENCE, path, config_path});
    };
    const auto same = check(logits);
    INFO(same.out << same.err);
    CHECK(same.exit_code == 0);
    // The comparison can fail: a logit off by 1e-3 is caught.
    torch::Tensor off = logits.detach().clone();
    off[1][3][4] += 1e-3;
    CHECK(check(off).exit_code == 1);
  }
}

TEST_CASE(
    "Under ZeRO-3 the decoder layers, the embedding and lm_head are the units (tied: the "
    "layers), and the forward is the same",
    "[models]") {
  torch::set_num_threads(1);
  for (const bool tied : {false, true}) {
    INFO("tie_word_embeddings " << tied);
    const LlamaConfig config = small("llama", 2, tied);
    torch::manual_seed(11);
    const torch::Tensor expected = LlamaForCausalLM(config)(tokens(config)).detach();
    auto fake = runtime::makeFakeWorld(2);
    std::vector<std::string> described(2);
    std::vector<double> difference(2, -1);
    std::mutex construction;
    onRanks(2, [&](int r) {
      LlamaForCausalLM model = [&] {
        std::lock_guard<std::mutex> lock(construction);
        torch::manual_seed(11);
        return LlamaForCausalLM(config);
      }();
      torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
      auto acc = rankAccelerator(fake, r, "zero3", /*init_flag=*/false);
      acc->prepare(model.ptr(), optimizer);
      described[r] = acc->describeStrategy();
      for (int pass = 0; pass < 2; ++pass) {  // the second with the units freed between uses
        difference[r] = (model(tokens(config)) - expected).abs().max().item<double>();
      }
    });
    // Untied: 2 layers, the embedding, lm_head; the final norm in a bucket. Tied: the
    // embedding (used twice) joins the bucket.
    CHECK_THAT(described[0], Catch::StartsWith(tied ? "zero3: 3 unit(s) (2 module(s)"
                                                    : "zero3: 5 unit(s) (4 module(s)"));
    CHECK(difference[0] == 0);
    CHECK(difference[1] == 0);
  }
}

TEST_CASE("A bf16 export loads back by name, and another model's export is refused, listing why",
          "[models]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const LlamaConfig config = small("qwen2", 2, false);
  auto fake = runtime::makeFakeWorld(1);
  auto accelerator = [&]() {
    runtime::World world;
    world.backend = runtime::makeFakeBackend(fake, 0);
    return std::make_unique<runtime::Accelerator>(std::move(world), runtime::AcceleratorOptions{});
  };
  torch::manual_seed(5);
  LlamaForCausalLM saved(config);
  torch::optim::AdamW saved_opt(saved->parameters());
  auto acc = accelerator();
  acc->prepare(saved.ptr(), saved_opt);
  acc->saveModel(dir.path() + "/export", 1u << 30, torch::kBFloat16);
  // What the export holds: each weight rounded to bf16.
  {
    torch::NoGradGuard no_grad;
    for (auto& p : saved->parameters()) p.copy_(p.to(torch::kBFloat16).to(torch::kFloat));
  }
  const torch::Tensor expected = saved(tokens(config)).detach();

  torch::manual_seed(6);  // other initial weights, overwritten by the load
  LlamaForCausalLM loaded(config);
  torch::optim::AdamW loaded_opt(loaded->parameters());
  auto acc2 = accelerator();
  acc2->prepare(loaded.ptr(), loaded_opt);
  acc2->loadModel(dir.path() + "/export");
  CHECK(torch::equal(loaded(tokens(config)).detach(), expected));

  LlamaConfig other_config = small("qwen2", 2, /*tied=*/true);
  other_config.num_hidden_layers = 3;
  other_config.intermediate_size = 40;
  LlamaForCausalLM other(other_config);
  torch::optim::AdamW other_opt(other->parameters());
  auto acc3 = accelerator();
  acc3->prepare(other.ptr(), other_opt);
  CHECK_THROWS_WITH(
      acc3->loadModel(dir.path() + "/export"),
      Catch::Contains("does not hold this model's tensors") &&
          Catch::Contains("missing in the export (12): model.layers.2.") &&
          Catch::Contains("unexpected (not in this model) (1): lm_head.weight") &&
          Catch::Contains("of another shape (6): model.layers.0.mlp.down_proj.weight [32, 56] "
                          "where the model has [32, 40]"));
}

TEST_CASE("zero3_save_16bit_model makes saveModel write 16-bit weights by default", "[models]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const LlamaConfig config = small("llama", 2, true);
  for (const bool sixteen : {false, true}) {
    auto fake = runtime::makeFakeWorld(1);
    runtime::World world;
    world.env.zero3_save_16bit_model = sixteen;  // CXXLAUNCH_ZERO3_SAVE_16BIT_MODEL
    world.backend = runtime::makeFakeBackend(fake, 0);
    runtime::Accelerator acc(std::move(world), {});
    LlamaForCausalLM model(config);
    torch::optim::AdamW optimizer(model->parameters());
    acc.prepare(model.ptr(), optimizer);
    const std::string out = dir.path() + (sixteen ? "/bf16" : "/fp32");
    acc.saveModel(out);
    std::set<c10::ScalarType> dtypes;
    runtime::checkpoint::readSafetensors(
        out, [&](const std::string&, const torch::Tensor& t) { dtypes.insert(t.scalar_type()); });
    CHECK(dtypes == std::set<c10::ScalarType>{sixteen ? torch::kBFloat16 : torch::kFloat});
  }
}

TEST_CASE("A padded batch's attention mask works as HF's, left and right", "[models]") {
  cxxlaunch::testing::TempDir dir;
  const LlamaConfig config = small("llama", 2, false);
  torch::manual_seed(9);
  LlamaForCausalLM model(config);
  const torch::Tensor ids = tokens(config);
  // Row 0 padded on the left (2 tokens), row 1 on the right (3 tokens).
  const torch::Tensor mask =
      torch::tensor({0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0}, torch::kLong).view({2, 7});
  const torch::Tensor labels = ids.masked_fill(mask == 0, -100);
  const torch::Tensor logits = model(ids, mask);
  const torch::Tensor loss = causalLmLoss(logits, labels);
  REQUIRE(std::isfinite(loss.item<double>()));
  // Right padding changes nothing before it: the real tokens' logits are the unpadded sequence's.
  const torch::Tensor unpadded = model(ids.narrow(0, 1, 1).narrow(1, 0, 4));
  CHECK(torch::allclose(logits.narrow(0, 1, 1).narrow(1, 0, 4), unpadded, 1e-5, 1e-6));
  // And the mask matters: without it the left-padded row's logits differ.
  CHECK_FALSE(torch::allclose(model(ids).narrow(0, 0, 1), logits.narrow(0, 0, 1), 1e-3, 1e-3));
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& item : model->named_parameters()) {
    tensors.emplace_back(item.key(), item.value().detach());
  }
  tensors.emplace_back("input_ids", ids);
  tensors.emplace_back("attention_mask", mask);
  tensors.emplace_back("labels", labels);
  tensors.emplace_back("loss", loss.detach().reshape({1}));
  tensors.emplace_back("logits", logits.detach());
  const std::string path = dir.path() + "/padded.safetensors";
  const std::string config_path = dir.path() + "/config.json";
  std::ofstream(config_path) << config.toJson();
  runtime::checkpoint::writeSafetensorsFile(path, tensors);
  const auto result = cxxlaunch::testing::run({SYSTEM_PYTHON, LLAMA_REFERENCE, path, config_path});
  INFO(result.out << result.err);
  CHECK(result.exit_code == 0);
}

TEST_CASE("Under deferredInit the parameters take no memory, and prepare makes the same model",
          "[models]") {
  torch::set_num_threads(1);
  const LlamaConfig config = small("llama", 2, false);
  torch::manual_seed(11);
  LlamaForCausalLM plain(config);
  const torch::Tensor expected = plain(tokens(config)).detach();
  {  // a scope that is off defers nothing
    runtime::DeferredInit off(false);
    CHECK(parameterBytes(*LlamaForCausalLM(config)) == parameterBytes(*plain));
  }
  for (const std::string strategy : {"zero3", "fsdp_full_shard", "ddp", "zero2"}) {
    INFO(strategy);
    auto fake = runtime::makeFakeWorld(2);
    std::vector<size_t> before(2);
    std::vector<char> nan_before(2, 0);  // not vector<bool>: ranks write their own elements
    std::vector<double> difference(2, -1);
    std::mutex construction;
    onRanks(2, [&](int r) {
      auto acc = rankAccelerator(fake, r, strategy, /*init_flag=*/true);
      LlamaForCausalLM model{nullptr};
      {
        std::lock_guard<std::mutex> lock(construction);
        torch::manual_seed(11);
        auto deferred = acc->deferredInit();
        model = LlamaForCausalLM(config);
      }
      before[r] = parameterBytes(*model);
      // Used before prepare made its values, the model says so in NaN rather than garbage.
      nan_before[r] = torch::isnan(model(tokens(config))).all().item<bool>();
      torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
      acc->prepare(model.ptr(), optimizer);
      difference[r] = (model(tokens(config)) - expected).abs().max().item<double>();
    });
    // One float per parameter tensor (21 of them) until prepare.
    CHECK(before[0] <= 21 * sizeof(float));
    CHECK(nan_before[0] == 1);
    CHECK(difference[0] == 0);
    CHECK(difference[1] == 0);
  }
}

TEST_CASE("Under ZeRO-3 each rank reads only its shards of an export, and loads it exactly",
          "[models]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  LlamaConfig config = small("llama", 2, false);
  config.hidden_size = 64;
  config.intermediate_size = 160;
  config.vocab_size = 400;
  torch::manual_seed(21);
  LlamaForCausalLM source(config);
  const torch::Tensor expected = source(tokens(config)).detach();
  {
    auto fake = runtime::makeFakeWorld(1);
    runtime::World world;
    world.backend = runtime::makeFakeBackend(fake, 0);
    runtime::Accelerator acc(std::move(world), {});
    torch::optim::AdamW optimizer(source->parameters());
    acc.prepare(source.ptr(), optimizer);
    acc.saveModel(dir.path() + "/export", 100'000);  // several files
  }
  size_t data_bytes = 0;
  for (const auto& p : source->parameters()) data_bytes += p.numel() * sizeof(float);
  // ZeRO-3: each rank its half; DDP: each rank everything (the measure can tell the two apart).
  for (const auto& [strategy, share] : {std::pair{"zero3", 0.5}, std::pair{"ddp", 1.0}}) {
    INFO(strategy);
    auto fake = runtime::makeFakeWorld(2);
    std::vector<double> difference(2, -1);
    int64_t read = 0;
    std::mutex construction;
    onRanks(2, [&](int r) {
      auto acc = rankAccelerator(fake, r, strategy, /*init_flag=*/true);
      LlamaForCausalLM model{nullptr};
      {
        std::lock_guard<std::mutex> lock(construction);
        auto deferred = acc->deferredInit();
        model = LlamaForCausalLM(config);
      }
      torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
      acc->prepare(model.ptr(), optimizer);
      // Counted from before the barrier: a rank may read all it needs before another wakes.
      const int64_t start = r == 0 ? bytesRead() : 0;
      acc->waitForEveryone();
      acc->loadModel(dir.path() + "/export");
      acc->waitForEveryone();
      if (r == 0) read = bytesRead() - start;
      difference[r] = (model(tokens(config)) - expected).abs().max().item<double>();
    });
    const double per_rank = static_cast<double>(read) / 2 / static_cast<double>(data_bytes);
    INFO("each rank read " << per_rank << " of the model's bytes");
    CHECK(per_rank > share * 0.95);
    CHECK(per_rank < share * 1.1);
    CHECK(difference[0] == 0);
    CHECK(difference[1] == 0);
  }
}
