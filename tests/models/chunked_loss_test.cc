// The chunked causal-LM loss against the plain path, causalLmLoss(model(input_ids), labels): the
// same loss and gradients (1e-5 relative in fp32), alone and under the runtime's strategies.

#include "models/chunked_loss.h"

#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"
#include "runtime/accelerator.h"
#include "runtime/precision/policy.h"
#include "runtime/world.h"
#include "support/ranks.h"

using namespace cxxlaunch;
using namespace cxxlaunch::models;

namespace {

LlamaConfig config(bool tied) {
  LlamaConfig c;
  c.model_type = "qwen2";
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 97;
  c.tie_word_embeddings = tied;
  return c;
}

// [3, 8]: 21 shifted tokens (no multiple of the chunks below); row 1 wholly ignored, and some
// -100s in the others.
std::pair<torch::Tensor, torch::Tensor> batch(int64_t vocab) {
  auto generator = at::detail::createCPUGenerator(5);
  const torch::Tensor ids = torch::randint(vocab, {3, 8}, generator);
  torch::Tensor labels = ids.clone();
  labels[1].fill_(-100);
  labels[0][0] = -100;  // never a target: the shift drops the first label
  labels[0][3] = -100;
  labels[2][5] = -100;
  labels[2][7] = -100;
  return {ids, labels};
}

// max |a - b| over max |b|: 0 for equal tensors, whatever their scale.
double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

std::map<std::string, torch::Tensor> gradients(torch::nn::Module& model) {
  std::map<std::string, torch::Tensor> grads;
  for (const auto& p : model.named_parameters()) grads[p.key()] = p.value().grad().clone();
  return grads;
}

}  // namespace

TEST_CASE("The chunked loss and its gradients equal causalLmLoss's on the model's logits",
          "[models][chunked_loss]") {
  torch::set_num_threads(1);
  for (const bool tied : {false, true}) {
    for (const int64_t chunk : {1, 4, 5, 64}) {
      INFO("tie_word_embeddings " << tied << ", chunk_tokens " << chunk);
      const LlamaConfig c = config(tied);
      torch::manual_seed(3);
      LlamaForCausalLM model(c);
      const auto [ids, labels] = batch(c.vocab_size);

      const torch::Tensor plain = causalLmLoss(model(ids), labels);
      plain.backward();
      const auto plain_grads = gradients(*model);
      model->zero_grad(/*set_to_none=*/true);

      const torch::Tensor chunked =
          chunkedCausalLmLoss(model, ids, labels, {}, {.chunk_tokens = chunk});
      chunked.backward();
      const auto chunked_grads = gradients(*model);

      CHECK(chunked.scalar_type() == torch::kFloat);
      CHECK(std::abs(chunked.item<double>() - plain.item<double>()) <=
            1e-5 * std::abs(plain.item<double>()));
      REQUIRE(chunked_grads.size() == plain_grads.size());
      for (const auto& [name, grad] : plain_grads) {
        INFO(name);
        CHECK(relative(chunked_grads.at(name), grad) <= 1e-5);
      }
    }
  }
}

TEST_CASE("The chunked loss's hidden and weight gradients equal the plain path's",
          "[models][chunked_loss]") {
  torch::set_num_threads(1);
  const int64_t vocab = 301, width = 24;
  torch::manual_seed(8);
  const torch::Tensor hidden0 = torch::randn({3, 8, width});
  const torch::Tensor weight0 = torch::randn({vocab, width}) * 0.5;
  const auto [ids, labels] = batch(vocab);

  auto run = [&](bool chunked) {
    torch::Tensor hidden = hidden0.clone().requires_grad_(true);
    torch::Tensor weight = weight0.clone().requires_grad_(true);
    const torch::Tensor loss =
        chunked ? chunkedCausalLmLoss(hidden, weight, labels, {.chunk_tokens = 6})
                : causalLmLoss(torch::matmul(hidden, weight.t()), labels);
    loss.backward();
    return std::vector<torch::Tensor>{loss.detach(), hidden.grad(), weight.grad()};
  };
  const auto plain = run(false), chunked = run(true);
  CHECK(relative(chunked[0], plain[0]) <= 1e-5);
  CHECK(relative(chunked[1], plain[1]) <= 1e-5);
  CHECK(relative(chunked[2], plain[2]) <= 1e-5);
  // The wholly ignored row gets no gradient, as in the plain path.
  CHECK(chunked[1][1].abs().max().item<double>() == 0);
  CHECK(plain[1][1].abs().max().item<double>() == 0);
}

TEST_CASE("Every label ignored: nan, as causalLmLoss, and zero gradients",
          "[models][chunked_loss]") {
  torch::manual_seed(1);
  const torch::Tensor labels = torch::full({2, 5}, -100, torch::kLong);
  for (const bool chunked : {false, true}) {
    INFO("chunked " << chunked);
    torch::Tensor hidden = torch::randn({2, 5, 8}).requires_grad_(true);
    torch::Tensor weight = torch::randn({11, 8}).requires_grad_(true);
    const torch::Tensor loss = chunked ? chunkedCausalLmLoss(hidden, weight, labels)
                                       : causalLmLoss(torch::matmul(hidden, weight.t()), labels);
    CHECK(std::isnan(loss.item<double>()));
    loss.backward();
    CHECK(hidden.grad().abs().max().item<double>() == 0);
    CHECK(weight.grad().abs().max().item<double>() == 0);
  }
}

TEST_CASE("A label outside the vocabulary is one clear error", "[models][chunked_loss]") {
  const torch::Tensor hidden = torch::randn({1, 4, 8});
  const torch::Tensor weight = torch::randn({11, 8});
  for (const int64_t bad : {11, -1}) {
    INFO("label " << bad);
    const torch::Tensor labels = torch::tensor(std::vector<int64_t>{1, 2, bad, 3}).unsqueeze(0);
    CHECK_THROWS_MATCHES(chunkedCausalLmLoss(hidden, weight, labels), InvalidArgument,
                         Catch::Message("label " + std::to_string(bad) +
                                        " (token 1) is outside the vocabulary [0, 11): give "
                                        "token ids below 11, or -100 for a token the loss "
                                        "ignores"));
  }
  const torch::Tensor fine = torch::tensor(std::vector<int64_t>{1, 2, 3, 4}).unsqueeze(0);
  CHECK_THROWS_AS(chunkedCausalLmLoss(hidden, torch::randn({11, 7}), fine), InvalidArgument);
}

TEST_CASE("A chunk's fp32 logits stay within the byte budget", "[models][chunked_loss]") {
  CHECK(chunkTokens(151936) == 220);  // 128 MiB / (151,936 * 4 bytes)
  CHECK(chunkTokens(151936, {.chunk_bytes = 64 << 20}) == 110);
  CHECK(chunkTokens(151936, {.chunk_tokens = 1000}) == 1000);
  CHECK(chunkTokens(1 << 30, {.chunk_bytes = 1}) == 1);
}

// The head's gradient reaches the parameters' accumulators once per backward: DDP's and ZeRO-3's
// gradient hooks fire (a second gradient throws; one that missed the hook would be reduced as
// unused, and the step would differ), and under ZeRO-3 lm_head is gathered for the loss and again
// for its backward (without, the head's freed storage fails the matmul). One SGD step with each
// loss ends at the same model.
TEST_CASE("Under DDP and ZeRO-3 a step with the chunked loss equals one with the plain loss",
          "[models][chunked_loss]") {
  torch::set_num_threads(1);
  for (const std::string strategy : {"ddp", "zero3"}) {
    for (const bool tied : {false, true}) {
      INFO(strategy << ", tie_word_embeddings " << tied);
      const LlamaConfig c = config(tied);
      const auto [ids, labels] = batch(c.vocab_size);
      std::map<bool, std::vector<double>> after;  // loss before, loss after the step; rank 0
      for (const bool chunked : {false, true}) {
        auto fake = runtime::makeFakeWorld(2);
        std::mutex construction;
        std::vector<std::vector<double>> losses(2);
        cxxlaunch::testing::onRanks(2, [&](int r) {
          LlamaForCausalLM model = [&] {
            std::lock_guard<std::mutex> lock(construction);
            torch::manual_seed(21);
            return LlamaForCausalLM(c);
          }();
          torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.5));
          runtime::World world;
          world.env.rank = r;
          world.env.world_size = 2;
          world.env.strategy = strategy;
          world.env.fsdp_auto_wrap_policy = runtime::WrapPolicy::kTransformerBased;
          world.env.fsdp_transformer_layer_cls = {"Qwen2DecoderLayer"};
          world.backend = runtime::makeFakeBackend(fake, r);
          runtime::Accelerator acc(std::move(world), runtime::AcceleratorOptions{});
          acc.prepare(model.ptr(), optimizer);
          const torch::Tensor loss =
              chunked ? chunkedCausalLmLoss(model, ids, labels, {}, {.chunk_tokens = 4})
                      : causalLmLoss(model(ids), labels);
          acc.backward(loss);
          const bool stepped = acc.step();  // Catch's assertions are for the test's thread
          losses[r] = {loss.item<double>(), causalLmLoss(model(ids), labels).item<double>(),
                       stepped ? 1.0 : 0.0};
        });
        after[chunked] = losses[0];
      }
      CHECK(after[false][2] == 1);
      CHECK(after[true][2] == 1);
      CHECK(after[false][1] < after[false][0] - 0.01);  // the step moved the model
      CHECK(std::abs(after[true][0] - after[false][0]) <= 1e-5 * after[false][0]);
      CHECK(std::abs(after[true][1] - after[false][1]) <= 1e-5 * after[false][1]);
    }
  }
}

// Mixed precision: the head a bf16 copy cast from an fp32 parameter (a compute copy), or fp32
// leaves under autocast. The gradients reach the fp32 leaves through the cast, as the plain
// path's do, and agree with the plain path's to bf16's rounding.
TEST_CASE("In bf16 the chunked loss follows the plain path, and the gradient reaches the master",
          "[models][chunked_loss]") {
  torch::set_num_threads(1);
  const int64_t vocab = 301, width = 24;
  torch::manual_seed(9);
  const torch::Tensor hidden0 = torch::randn({3, 8, width});
  const torch::Tensor weight0 = torch::randn({vocab, width}) * 0.5;
  const auto [ids, labels] = batch(vocab);
  for (const bool autocast : {false, true}) {
    INFO("autocast " << autocast);
    auto run = [&](bool chunked) {
      torch::Tensor hidden = hidden0.clone().requires_grad_(true);
      torch::Tensor master = weight0.clone().requires_grad_(true);
      torch::Tensor loss;
      {
        runtime::AutocastScope scope(torch::kCPU, torch::kBFloat16, autocast);
        const torch::Tensor h = autocast ? hidden : hidden.to(torch::kBFloat16);
        const torch::Tensor w = autocast ? master : master.to(torch::kBFloat16);
        loss = chunked ? chunkedCausalLmLoss(h, w, labels, {.chunk_tokens = 6})
                       : causalLmLoss(torch::matmul(h, w.t()), labels);
      }
      loss.backward();
      return std::vector<torch::Tensor>{loss.detach(), hidden.grad(), master.grad()};
    };
    const auto plain = run(false), chunked = run(true);
    REQUIRE(chunked[2].defined());
    CHECK(chunked[0].scalar_type() == torch::kFloat);
    CHECK(chunked[2].scalar_type() == torch::kFloat);
    CHECK(relative(chunked[0], plain[0]) <= 1e-5);  // the same bf16 logits, upcast
    CHECK(relative(chunked[1], plain[1]) <= 2e-2);
    CHECK(relative(chunked[2], plain[2]) <= 2e-2);
  }
}
