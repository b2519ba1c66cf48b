// The two halves of packing together: rows that text::packExamples lays out (best-fit
// decreasing, padding, first labels ignored), fed to the model with their position_ids, give the
// loss and gradients of the examples run one by one. Built where text/ is (it needs PCRE2 and
// ICU, which a GPU machine's bundle build may lack).

#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "models/chunked_loss.h"
#include "models/llama.h"
#include "text/packing.h"

using namespace cxxlaunch;
using namespace cxxlaunch::models;

namespace {

// [rows, length] int64 from the rows' int32 field `field`.
torch::Tensor stack(const std::vector<text::Row>& rows, std::vector<int32_t> text::Row::*field) {
  std::vector<torch::Tensor> out;
  for (const text::Row& row : rows) {
    out.push_back(torch::tensor(row.*field, torch::kInt).to(torch::kLong));
  }
  return torch::stack(out);
}

torch::Tensor ids(const std::vector<int32_t>& v) {
  return torch::tensor(v, torch::kInt).to(torch::kLong).unsqueeze(0);
}

}  // namespace

TEST_CASE("Rows from text::packExamples train as their examples one by one", "[models][packing]") {
  torch::set_num_threads(1);
  LlamaConfig c;
  c.model_type = "llama";
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 53;
  torch::manual_seed(31);
  LlamaForCausalLM model(c);

  // 14 examples of 1 to 12 tokens, a prompt of a third of each masked; one of a single token
  // (nothing to predict, alone or packed).
  std::mt19937 rng(5);
  std::vector<text::TrainingExample> examples;
  for (int i = 0; i < 14; ++i) {
    text::TrainingExample e;
    const size_t n = i == 0 ? 1 : 1 + rng() % 12;
    for (size_t k = 0; k < n; ++k) e.input_ids.push_back(static_cast<int32_t>(1 + rng() % 52));
    e.labels = e.input_ids;
    for (size_t k = 0; k < n / 3; ++k) e.labels[k] = text::kIgnoreIndex;
    examples.push_back(e);
  }

  // One by one: the sum of the examples' loss sums over the count of their labels.
  torch::Tensor sum = torch::zeros({});
  int64_t count = 0;
  for (const auto& e : examples) {
    const torch::Tensor logits = model(ids(e.input_ids))[0];
    const torch::Tensor labels = ids(e.labels)[0];
    const int64_t n = labels.size(0);
    sum = sum + torch::nn::functional::cross_entropy(
                    logits.narrow(0, 0, n - 1), labels.narrow(0, 1, n - 1),
                    torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(
                        torch::kSum));
    count += (labels.narrow(0, 1, n - 1) != -100).sum().item<int64_t>();
  }
  const torch::Tensor expected = sum / static_cast<double>(count);
  expected.backward();
  std::map<std::string, torch::Tensor> expected_grads;
  for (const auto& p : model->named_parameters())
    expected_grads[p.key()] = p.value().grad().clone();

  const auto rows = text::packExamples(examples, {.length = 16, .pad_id = 0});
  REQUIRE(rows.size() >= 2);
  const torch::Tensor input_ids = stack(rows, &text::Row::input_ids);
  const torch::Tensor labels = stack(rows, &text::Row::labels);
  const torch::Tensor positions = stack(rows, &text::Row::position_ids);
  for (const bool chunked : {false, true}) {
    INFO("chunked " << chunked);
    model->zero_grad(/*set_to_none=*/true);
    const torch::Tensor loss =
        chunked ? chunkedCausalLmLoss(model, input_ids, labels, {}, positions, {.chunk_tokens = 7})
                : causalLmLoss(model->forward(input_ids, {}, positions), labels);
    loss.backward();
    CHECK(std::abs(loss.item<double>() - expected.item<double>()) <=
          1e-5 * std::abs(expected.item<double>()));
    for (const auto& p : model->named_parameters()) {
      INFO(p.key());
      const torch::Tensor& want = expected_grads.at(p.key());
      CHECK((p.value().grad() - want).abs().max().item<double>() <=
            1e-5 * want.abs().max().item<double>());
    }
  }
}
