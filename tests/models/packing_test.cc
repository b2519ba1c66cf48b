// position_ids and packed rows (models/llama.h): a row of several examples, each with positions
// from 0 and its first label ignored, gives the loss and the gradients of the same examples run
// one by one (the loss token-weighted: the sum of their loss sums over the count of their
// labels), through causalLmLoss and through chunkedCausalLmLoss, alone and under DDP and ZeRO-3;
// without position_ids the examples see each other and the loss differs; and the packed logits
// equal the independent plain-PyTorch forward's (llama_reference.py) given the same positions.

#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "models/chunked_loss.h"
#include "models/llama.h"
#include "runtime/accelerator.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/world.h"
#include "support/ranks.h"
#include "support/subprocess.h"

using namespace cxxlaunch;
using namespace cxxlaunch::models;

namespace {

constexpr int64_t kPad = 0;

LlamaConfig config(const std::string& type, int64_t kv_heads, bool tied) {
  LlamaConfig c;
  c.model_type = type;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = kv_heads;
  c.vocab_size = 61;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = tied;
  return c;
}

struct Example {
  torch::Tensor ids, labels;  // [n]
};

// Five examples of 5, 3, 6, 2 and 4 tokens (ids 1..60, never the pad id), some labels masked
// as a completion-only loss masks a prompt; each keeps at least one label after the shift.
std::vector<Example> examples(int64_t vocab) {
  auto generator = at::detail::createCPUGenerator(13);
  std::vector<Example> out;
  for (const int64_t n : {5, 3, 6, 2, 4}) {
    const torch::Tensor ids = torch::randint(1, vocab, {n}, generator);
    torch::Tensor labels = ids.clone();
    if (n >= 4) labels.narrow(0, 0, 2).fill_(-100);
    out.push_back({ids, labels});
  }
  return out;
}

struct Packed {
  torch::Tensor ids, labels, positions, mask;  // [rows, length]
};

// The examples in rows of 8, as text::packExamples lays them out: {0, 1}, {2, 3}, {4, padding};
// positions from 0 per example and for the padding, each example's first label -100.
Packed pack(const std::vector<Example>& examples) {
  const int64_t length = 8;
  const std::vector<std::vector<size_t>> layout = {{0, 1}, {2, 3}, {4}};
  std::vector<torch::Tensor> ids, labels, positions, mask;
  for (const auto& row : layout) {
    std::vector<torch::Tensor> i, l, p, m;
    int64_t used = 0;
    for (const size_t e : row) {
      const int64_t n = examples[e].ids.size(0);
      i.push_back(examples[e].ids);
      torch::Tensor first_ignored = examples[e].labels.clone();
      first_ignored[0] = -100;
      l.push_back(first_ignored);
      p.push_back(torch::arange(n, torch::kLong));
      m.push_back(torch::ones({n}, torch::kLong));
      used += n;
    }
    if (used < length) {
      i.push_back(torch::full({length - used}, kPad, torch::kLong));
      l.push_back(torch::full({length - used}, -100, torch::kLong));
      p.push_back(torch::arange(length - used, torch::kLong));
      m.push_back(torch::zeros({length - used}, torch::kLong));
    }
    ids.push_back(torch::cat(i));
    labels.push_back(torch::cat(l));
    positions.push_back(torch::cat(p));
    mask.push_back(torch::cat(m));
  }
  return {torch::stack(ids), torch::stack(labels), torch::stack(positions), torch::stack(mask)};
}

// max |a - b| over max |b|.
double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

std::map<std::string, torch::Tensor> takeGradients(torch::nn::Module& model) {
  std::map<std::string, torch::Tensor> grads;
  for (const auto& p : model.named_parameters()) grads[p.key()] = p.value().grad().clone();
  model.zero_grad(/*set_to_none=*/true);
  return grads;
}

// The examples one by one: the sum of each one's loss sum over the count of all their labels.
torch::Tensor oneByOne(LlamaForCausalLM& model, const std::vector<Example>& examples) {
  torch::Tensor sum = torch::zeros({});
  int64_t count = 0;
  for (const Example& e : examples) {
    const int64_t n = (e.labels.narrow(0, 1, e.labels.size(0) - 1) != -100).sum().item<int64_t>();
    sum = sum + causalLmLoss(model(e.ids.unsqueeze(0)), e.labels.unsqueeze(0)) * n;
    count += n;
  }
  return sum / static_cast<double>(count);
}

}  // namespace

TEST_CASE("A packed batch's loss and gradients equal those of its examples one by one",
          "[models][packing]") {
  torch::set_num_threads(1);
  struct Case {
    std::string type;
    int64_t kv_heads;
    bool tied;
  };
  for (const Case& c : {Case{"llama", 2, false}, Case{"qwen2", 1, true}}) {
    const LlamaConfig cfg = config(c.type, c.kv_heads, c.tied);
    torch::manual_seed(17);
    LlamaForCausalLM model(cfg);
    const auto all = examples(cfg.vocab_size);
    const Packed packed = pack(all);

    const torch::Tensor expected = oneByOne(model, all);
    expected.backward();
    const auto expected_grads = takeGradients(*model);

    enum class Path { kPlain, kPlainMasked, kChunked };
    for (const Path path : {Path::kPlain, Path::kPlainMasked, Path::kChunked}) {
      INFO(c.type << " kv_heads " << c.kv_heads << " tied " << c.tied << ", path "
                  << static_cast<int>(path));
      torch::Tensor loss;
      switch (path) {
        case Path::kPlain:
          loss = causalLmLoss(model->forward(packed.ids, {}, packed.positions), packed.labels);
          break;
        case Path::kPlainMasked:  // an attention_mask over the padding as well changes nothing
          loss = causalLmLoss(model(packed.ids, packed.mask, packed.positions), packed.labels);
          break;
        case Path::kChunked:
          loss = chunkedCausalLmLoss(model, packed.ids, packed.labels, {}, packed.positions,
                                     {.chunk_tokens = 5});
          break;
      }
      loss.backward();
      const auto grads = takeGradients(*model);
      CHECK(std::abs(loss.item<double>() - expected.item<double>()) <=
            1e-5 * std::abs(expected.item<double>()));
      REQUIRE(grads.size() == expected_grads.size());
      for (const auto& [name, grad] : expected_grads) {
        INFO(name);
        CHECK(relative(grads.at(name), grad) <= 1e-5);
      }
    }
  }
}

TEST_CASE("Without position_ids the packed examples see each other, and the loss differs",
          "[models][packing]") {
  torch::set_num_threads(1);
  const LlamaConfig cfg = config("llama", 2, false);
  torch::manual_seed(17);
  LlamaForCausalLM model(cfg);
  const auto all = examples(cfg.vocab_size);
  const Packed packed = pack(all);
  torch::NoGradGuard no_grad;
  // The second example of row 0 (tokens 5..7): with positions its logits are its own run's; with
  // the row's plain causal mask and positions it attends to the first example, and they are not.
  const torch::Tensor alone = model(all[1].ids.unsqueeze(0))[0];
  const torch::Tensor with = model->forward(packed.ids, {}, packed.positions)[0].narrow(0, 5, 3);
  const torch::Tensor without = model(packed.ids)[0].narrow(0, 5, 3);
  CHECK(relative(with, alone) <= 1e-5);
  CHECK(relative(without, alone) > 1e-2);
  const double expected = oneByOne(model, all).item<double>();
  const double leaked = causalLmLoss(model(packed.ids), packed.labels).item<double>();
  CHECK(std::abs(leaked - expected) > 1e-3 * std::abs(expected));
  CHECK(std::abs(chunkedCausalLmLoss(model, packed.ids, packed.labels).item<double>() - expected) >
        1e-3 * std::abs(expected));
  // Bad position_ids are refused by shape and type, before any work.
  CHECK_THROWS_WITH(model->forward(packed.ids, {}, packed.positions.narrow(1, 0, 4)),
                    Catch::Contains("position_ids must be int64 of input_ids' shape"));
  CHECK_THROWS_WITH(model->forward(packed.ids, {}, packed.positions.to(torch::kInt)),
                    Catch::Contains("position_ids must be int64 of input_ids' shape"));
}

TEST_CASE("Packed logits equal the plain-PyTorch reference given the same position_ids",
          "[models][packing]") {
  cxxlaunch::testing::TempDir dir;
  const LlamaConfig cfg = config("qwen2", 2, false);
  torch::manual_seed(23);
  LlamaForCausalLM model(cfg);
  const Packed packed = pack(examples(cfg.vocab_size));
  const torch::Tensor logits = model->forward(packed.ids, {}, packed.positions).detach();
  const torch::Tensor loss = causalLmLoss(logits, packed.labels).detach();
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& item : model->named_parameters()) {
    tensors.emplace_back(item.key(), item.value().detach());
  }
  tensors.emplace_back("input_ids", packed.ids);
  tensors.emplace_back("position_ids", packed.positions);
  tensors.emplace_back("labels", packed.labels);
  tensors.emplace_back("loss", loss.reshape({1}));
  const std::string config_path = dir.path() + "/config.json";
  std::ofstream(config_path) << cfg.toJson();
  auto check = [&](const torch::Tensor& ours) {
    const std::string path = dir.path() + "/packed.safetensors";
    auto all = tensors;
    all.emplace_back("logits", ours);
    runtime::checkpoint::writeSafetensorsFile(path, all);
    return cxxlaunch::testing::run({SYSTEM_PYTHON, LLAMA_REFERENCE, path, config_path});
  };
  const auto same = check(logits);
  INFO(same.out << same.err);
  CHECK(same.exit_code == 0);
  // The comparison can fail: the row's logits without position_ids (a leaking mask) do not pass.
  const auto leaked = check(model(packed.ids).detach());
  INFO(leaked.out);
  CHECK(leaked.exit_code == 1);
}

// The same packed batch on two ranks (each rank its own copy, as data-parallel replicas of one
// batch) under DDP and ZeRO-3, the decoder layers as units: the loss before the step equals the
// one-by-one loss, and one SGD step ends at the same loss in both strategies.
TEST_CASE("Under DDP and ZeRO-3 a packed step equals the one-by-one loss and each other",
          "[models][packing]") {
  torch::set_num_threads(1);
  const LlamaConfig cfg = config("llama", 2, false);
  const auto all = examples(cfg.vocab_size);
  const Packed packed = pack(all);
  torch::manual_seed(29);
  LlamaForCausalLM reference(cfg);
  const double expected = oneByOne(reference, all).item<double>();
  std::map<std::string, std::vector<double>> after;  // strategy+path -> before, after, stepped
  for (const std::string strategy : {"ddp", "zero3"}) {
    for (const bool chunked : {false, true}) {
      auto fake = runtime::makeFakeWorld(2);
      std::mutex construction;
      std::vector<std::vector<double>> losses(2);
      cxxlaunch::testing::onRanks(2, [&](int r) {
        LlamaForCausalLM model = [&] {
          std::lock_guard<std::mutex> lock(construction);
          torch::manual_seed(29);
          return LlamaForCausalLM(cfg);
        }();
        torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.5));
        runtime::World world;
        world.env.rank = r;
        world.env.world_size = 2;
        world.env.strategy = strategy;
        world.env.fsdp_auto_wrap_policy = runtime::WrapPolicy::kTransformerBased;
        world.env.fsdp_transformer_layer_cls = {"LlamaDecoderLayer"};
        world.backend = runtime::makeFakeBackend(fake, r);
        runtime::Accelerator acc(std::move(world), runtime::AcceleratorOptions{});
        acc.prepare(model.ptr(), optimizer);
        auto lossOf = [&] {
          return chunked ? chunkedCausalLmLoss(model, packed.ids, packed.labels, {},
                                               packed.positions, {.chunk_tokens = 4})
                         : causalLmLoss(model->forward(packed.ids, {}, packed.positions),
                                        packed.labels);
        };
        const torch::Tensor loss = lossOf();
        acc.backward(loss);
        const bool stepped = acc.step();
        losses[r] = {loss.item<double>(), lossOf().item<double>(), stepped ? 1.0 : 0.0};
      });
      after[strategy + (chunked ? " chunked" : " plain")] = losses[0];
    }
  }
  const std::vector<double>& base = after.at("ddp plain");
  CHECK(std::abs(base[0] - expected) <= 1e-5 * expected);
  CHECK(base[1] < base[0] - 0.01);  // the step moved the model
  for (const auto& [name, losses] : after) {
    INFO(name);
    CHECK(losses[2] == 1);
    CHECK(std::abs(losses[0] - base[0]) <= 1e-5 * base[0]);
    CHECK(std::abs(losses[1] - base[1]) <= 1e-5 * base[1]);
  }
}

// Rotary attention depends on positions only through their differences, and within an example
// those are the same whatever the example's offset in the row: the tests above hold with the
// row's positions too, to rounding. The tables at given positions are checked here directly.
TEST_CASE("The rotary tables at position_ids are the plain tables' rows at those positions",
          "[models][packing]") {
  const LlamaConfig cfg = config("llama", 2, false);
  const torch::Tensor positions =
      torch::tensor({0, 1, 2, 0, 1, 5, 6, 3}, torch::kLong).view({2, 4});
  const auto [cos, sin] = rotaryTables(cfg, positions);
  const auto [plain_cos, plain_sin] = rotaryTables(cfg, 7, torch::kCPU);
  REQUIRE(cos.sizes() == torch::IntArrayRef({2, 1, 4, cfg.headDim()}));
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < 4; ++t) {
      const int64_t p = positions[b][t].item<int64_t>();
      CHECK(torch::equal(cos[b][0][t], plain_cos[p]));
      CHECK(torch::equal(sin[b][0][t], plain_sin[p]));
    }
  }
}
