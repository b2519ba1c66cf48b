// models/lora.h: PEFT's math, initialisation and names, the bad configs, the adapter's files,
// and the forward against an independent plain-PyTorch LoRA forward (lora_reference.py, on
// llama_reference.py's Llama) reading the adapter_model.safetensors written here.

#include "models/lora.h"

#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>

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

LlamaConfig small() {
  LlamaConfig c;
  c.hidden_size = 32;
  c.intermediate_size = 56;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 50;
  c.rms_norm_eps = 1e-5;
  return c;
}

torch::Tensor tokens(const LlamaConfig& c) {
  return torch::randint(c.vocab_size, {2, 7}, at::detail::createCPUGenerator(3));
}

LoraConfig lora(int64_t r, double alpha, std::vector<std::string> targets) {
  LoraConfig l;
  l.r = r;
  l.alpha = alpha;
  l.target_modules = std::move(targets);
  return l;
}

std::map<std::string, torch::Tensor> named(const torch::nn::Module& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model.named_parameters()) out[item.key()] = item.value();
  return out;
}

// Every B drawn at random (a trained adapter's are not zero), from a generator of its own.
void randomizeB(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  auto generator = at::detail::createCPUGenerator(17);
  for (auto& item : model.named_parameters()) {
    if (item.key().ends_with("lora_B.weight")) item.value().normal_(0, 0.5, generator);
  }
}

}  // namespace

TEST_CASE("LoRA adds scale * B A x to the targeted Linears, named and initialised as PEFT's",
          "[models][lora]") {
  torch::manual_seed(5);
  LlamaForCausalLM model(small());
  const auto before = named(*model);
  const auto adapted = addLora(*model, lora(4, 16, {"q_proj", "v_proj"}));
  REQUIRE(adapted.size() == 4);
  CHECK(adapted[0] == "model.layers.0.self_attn.q_proj");
  CHECK(adapted[1] == "model.layers.0.self_attn.v_proj");
  const auto params = named(*model);
  CHECK(params.size() == before.size() + 8);
  // PEFT's names less the adapter name: A [r, in], B [out, r].
  const torch::Tensor a = params.at("model.layers.1.self_attn.v_proj.lora_A.weight");
  const torch::Tensor b = params.at("model.layers.1.self_attn.v_proj.lora_B.weight");
  CHECK(a.sizes() == torch::IntArrayRef({4, 32}));
  CHECK(b.sizes() == torch::IntArrayRef({16, 4}));  // 2 kv heads of 8
  CHECK(params.count("model.layers.0.self_attn.k_proj.lora_A.weight") == 0);
  // Every original parameter frozen, and only the factors trainable.
  for (const auto& [name, p] : params) CHECK(p.requires_grad() == isLoraParameter(name));
  CHECK(trainableParameters(*model).size() == 8);
  // B zeros; A Kaiming-uniform (a = √5): U(-1/√in, 1/√in), whose variance is bound² / 3.
  CHECK(b.abs().max().item<double>() == 0);
  const double bound = 1 / std::sqrt(32.0);
  torch::Tensor all_a = torch::cat({params.at("model.layers.0.self_attn.q_proj.lora_A.weight"),
                                    params.at("model.layers.0.self_attn.v_proj.lora_A.weight"),
                                    params.at("model.layers.1.self_attn.q_proj.lora_A.weight"), a})
                            .flatten();
  CHECK(all_a.abs().max().item<double>() <= bound);
  CHECK(all_a.abs().max().item<double>() > 0.9 * bound);
  CHECK(all_a.var().item<double>() == Approx(bound * bound / 3).epsilon(0.15));
  CHECK(all_a.mean().item<double>() == Approx(0).margin(0.1 * bound));

  // A fresh adapter changes nothing; a trained one adds scale · B (A x), by hand.
  LlamaForCausalLM base(small());
  {
    torch::NoGradGuard no_grad;
    for (auto& [name, p] : named(*base)) p.copy_(params.at(name));
  }
  const torch::Tensor ids = tokens(small());
  CHECK(torch::equal(model(ids), base(ids)));
  randomizeB(*model);
  const torch::Tensor x = torch::randn({3, 32});
  auto& v_proj = *model->model->layers[1]->as<LlamaDecoderLayerImpl>()->self_attn->v_proj;
  const torch::Tensor by_hand = torch::matmul(x, v_proj.weight.t()) +
                                (16.0 / 4) * torch::matmul(torch::matmul(x, a.t()), b.t());
  CHECK(torch::allclose(linearForward(v_proj, x), by_hand, 1e-5, 1e-6));
  CHECK(!torch::allclose(model(ids), base(ids)));

  // rsLoRA: alpha / √r; all-linear: the seven projections of every layer, never lm_head.
  LoraConfig rs = lora(4, 16, {kAllLinear});
  rs.use_rslora = true;
  CHECK(rs.scale() == 8);
  CHECK(lora(4, 16, {"q_proj"}).scale() == 4);
  LlamaForCausalLM wide(small());
  const auto every = addLora(*wide, rs);
  CHECK(every.size() == 14);
  for (const auto& name : every) CHECK(name.find("lm_head") == std::string::npos);
  // A module named by its full name or a dotted suffix, as PEFT matches.
  LlamaForCausalLM one(small());
  CHECK(addLora(*one, lora(2, 8, {"layers.1.mlp.down_proj"})) ==
        std::vector<std::string>{"model.layers.1.mlp.down_proj"});
}

TEST_CASE("LoRA refuses a target that matches nothing, a bad rank, alpha or dropout",
          "[models][lora]") {
  LlamaForCausalLM model(small());
  const size_t count = named(*model).size();
  CHECK_THROWS_WITH(addLora(*model, lora(4, 8, {"q_proj", "qkv_proj"})),
                    Catch::Contains("'qkv_proj' matches no Linear module") &&
                        Catch::Contains("down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, "
                                        "v_proj"));
  CHECK_THROWS_WITH(addLora(*model, lora(4, 8, {"lm_head"})),
                    Catch::Contains("'lm_head' matches no Linear module"));
  CHECK_THROWS_WITH(addLora(*model, lora(0, 8, {"q_proj"})),
                    Catch::Contains("lora_r must be 1 or more (got 0)"));
  // k_proj is 16 x 32: r 17 does not fit it (q_proj's 32 x 32 would take it).
  CHECK_THROWS_WITH(addLora(*model, lora(17, 8, {"q_proj", "k_proj"})),
                    Catch::Contains("lora_r 17 is larger than 'model.layers.0.self_attn.k_proj' "
                                    "(16 x 32): give at most 16"));
  CHECK_THROWS_WITH(addLora(*model, lora(4, 0, {"q_proj"})),
                    Catch::Contains("lora_alpha must be a finite number > 0 (got 0)"));
  LoraConfig drop = lora(4, 8, {"q_proj"});
  drop.dropout = 1;
  CHECK_THROWS_WITH(addLora(*model, drop), Catch::Contains("lora_dropout must be in [0, 1)"));
  drop.dropout = -0.1;
  CHECK_THROWS_AS(addLora(*model, drop), InvalidArgument);
  // Nothing changed by the refusals: no factor added, nothing frozen.
  CHECK(named(*model).size() == count);
  for (const auto& p : model->parameters()) CHECK(p.requires_grad());
  addLora(*model, lora(4, 8, {"q_proj"}));
  CHECK_THROWS_WITH(addLora(*model, lora(4, 8, {"q_proj"})),
                    Catch::Contains("has LoRA adapters already"));
}

TEST_CASE("LoRA's initial values are the same in every strategy, built deferred or not",
          "[models][lora]") {
  torch::set_num_threads(1);
  const LlamaConfig config = small();
  torch::manual_seed(11);
  LlamaForCausalLM plain(config);
  addLora(*plain, lora(4, 8, {kAllLinear}));
  const auto expected = named(*plain);
  for (const std::string strategy : {"zero3", "fsdp_full_shard", "ddp", "zero2"}) {
    INFO(strategy);
    auto fake = runtime::makeFakeWorld(2);
    std::vector<double> difference(2, -1);
    std::mutex construction;
    onRanks(2, [&](int r) {
      runtime::World world;
      world.env.rank = r;
      world.env.world_size = 2;
      world.env.strategy = strategy;
      world.env.fsdp_auto_wrap_policy = runtime::WrapPolicy::kTransformerBased;
      world.env.fsdp_transformer_layer_cls = {"LlamaDecoderLayer"};
      world.env.zero3_init_flag = true;
      world.backend = runtime::makeFakeBackend(fake, r);
      runtime::Accelerator acc(std::move(world), {});
      LlamaForCausalLM model{nullptr};
      {
        std::lock_guard<std::mutex> lock(construction);
        torch::manual_seed(11);
        auto deferred = acc.deferredInit();
        model = LlamaForCausalLM(config);
        addLora(*model, lora(4, 8, {kAllLinear}));
      }
      torch::optim::AdamW optimizer(trainableParameters(*model), torch::optim::AdamWOptions(1e-3));
      acc.prepare(model.ptr(), optimizer);
      double worst = 0;
      const auto factors = peftTensors(acc.fullParameters());
      for (const auto& [key, value] : factors) {
        const std::string name = key.substr(std::string(kPeftPrefix).size());
        worst = std::max(worst, (value - expected.at(name)).abs().max().item<double>());
      }
      difference[r] = factors.size() == 28 ? worst : -2;
    });
    CHECK(difference[0] == 0);
    CHECK(difference[1] == 0);
  }
}

TEST_CASE("An adapter written in PEFT's layout gives the plain-PyTorch LoRA forward's logits",
          "[models][lora]") {
  cxxlaunch::testing::TempDir dir;
  for (const bool rslora : {false, true}) {
    INFO("use_rslora " << rslora);
    const LlamaConfig config = small();
    torch::manual_seed(23);
    LlamaForCausalLM model(config);
    std::vector<std::pair<std::string, torch::Tensor>> base;
    for (const auto& item : model->named_parameters()) base.emplace_back(item.key(), item.value());
    const std::string model_dir = dir.path() + "/base";
    fs::create_directories(model_dir);
    runtime::checkpoint::writeSafetensorsFile(model_dir + "/model.safetensors", base);
    std::ofstream(model_dir + "/config.json") << config.toJson();
    LoraConfig l = lora(3, 5, {"q_proj", "k_proj", "o_proj", "up_proj", "down_proj"});
    l.use_rslora = rslora;
    const auto adapted = addLora(*model, l);
    randomizeB(*model);
    const std::string adapter = dir.path() + "/adapter";
    fs::create_directories(adapter);
    std::vector<std::pair<std::string, torch::Tensor>> params;
    for (const auto& item : model->named_parameters())
      params.emplace_back(item.key(), item.value());
    const auto tensors = peftTensors(params);
    CHECK(tensors.size() == 20);
    CHECK(tensors[0].first == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
    runtime::checkpoint::writeSafetensorsFile(adapter + "/adapter_model.safetensors", tensors);
    const std::string json = adapterConfigJson(l, adapted, model_dir);
    std::ofstream(adapter + "/adapter_config.json") << json;
    const auto j = nlohmann::json::parse(json);
    CHECK(j["peft_type"] == "LORA");
    CHECK(j["target_modules"] ==
          nlohmann::json({"down_proj", "k_proj", "o_proj", "q_proj", "up_proj"}));
    // It reads back as the config it was written from.
    const LoraConfig back = adapterConfigFromJson(json, "adapter_config.json");
    CHECK(back.r == 3);
    CHECK(back.scale() == l.scale());

    const torch::Tensor ids = tokens(config);
    const torch::Tensor logits = model(ids).detach();
    auto check = [&](const torch::Tensor& ours) {
      const std::string path = dir.path() + "/case.safetensors";
      runtime::checkpoint::writeSafetensorsFile(path, {{"input_ids", ids}, {"logits", ours}});
      return cxxlaunch::testing::run({SYSTEM_PYTHON, LORA_REFERENCE, model_dir, adapter, path});
    };
    const auto same = check(logits);
    INFO(same.out << same.err);
    CHECK(same.exit_code == 0);
    torch::Tensor off = logits.clone();
    off[1][3][4] += 1e-3;
    CHECK(check(off).exit_code == 1);  // the comparison can fail

    // The files load back into a fresh model: frozen base, adapters by PEFT's keys.
    LlamaForCausalLM loaded(config);
    addLora(*loaded, back);
    loadAdapterWeights(*loaded, adapter + "/adapter_model.safetensors");
    loadFrozenWeights(*loaded, model_dir);
    CHECK(torch::equal(loaded(ids), logits));
    // An adapter of another rank, or a base of other shapes, is refused with the shapes named.
    LlamaForCausalLM other(config);
    addLora(*other, lora(2, 5, {"q_proj", "k_proj", "o_proj", "up_proj", "down_proj"}));
    CHECK_THROWS_WITH(loadAdapterWeights(*other, adapter + "/adapter_model.safetensors"),
                      Catch::Contains("base_model.model.model.layers.0.self_attn.q_proj.lora_A."
                                      "weight is [3, 32] where the model's is [2, 32]"));
    LlamaConfig wider = config;
    wider.intermediate_size = 64;
    LlamaForCausalLM mismatched(wider);
    addLora(*mismatched, back);
    CHECK_THROWS_WITH(loadFrozenWeights(*mismatched, model_dir),
                      Catch::Contains("model.layers.0.mlp.up_proj.weight [56, 32] where the model "
                                      "has [64, 32]"));
  }
  CHECK_THROWS_WITH(adapterConfigFromJson(R"({"peft_type": "IA3"})", "a.json"),
                    Catch::Contains("a.json: peft_type is not \"LORA\""));
  CHECK_THROWS_WITH(adapterConfigFromJson(
                        R"({"peft_type": "LORA", "r": 0, "target_modules": ["q_proj"]})", "a.json"),
                    Catch::Contains("a.json: lora_r must be 1 or more"));
  CHECK_THROWS_WITH(adapterConfigFromJson("{", "a.json"), Catch::Contains("a.json is not JSON"));
}
