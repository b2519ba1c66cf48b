// mistake_trainer: a trainer with one of a new user's mistakes, as a user writes it (no try, no
// catch): what the runtime makes of it is the test (runtime_integration_test.cc).
//   mistake_trainer batch0     prepareDataLoader(dataset, 0)
//   mistake_trainer own_step   optimizer.step() / zero_grad() in place of acc.step()
//   mistake_trainer main_only_save   saveCheckpoint on the main process only, after 2 steps,
//                                    while the others wait for everyone
//   mistake_trainer direct_unit      after a step, its unit called directly, not through
//                                    unitForward (freed under ZeRO-3 with Linear as the unit)

#include <torch/torch.h>

#include <cstring>

#include "runtime/accelerator.h"

using namespace cxxlaunch::runtime;

struct Pairs : torch::data::datasets::Dataset<Pairs> {
  torch::data::Example<> get(size_t i) override {
    const auto x = torch::full({4}, static_cast<float>(i % 7));
    return {x, x.sum(0, true)};
  }
  torch::optional<size_t> size() const override { return 64; }
};

// One layer, run through unitForward: a shard unit where the policy names Linear.
struct NetImpl : torch::nn::Module {
  NetImpl() : layer(register_module("layer", torch::nn::Linear(4, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) { return unitForward(layer, x); }
  torch::nn::Linear layer;
};
TORCH_MODULE(Net);

int main(int argc, char** argv) {
  const std::string mistake = argc > 1 ? argv[1] : "";
  torch::set_num_threads(1);
  Accelerator acc;
  torch::manual_seed(0);
  Net model;
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
  acc.prepare(model.ptr(), optimizer);
  auto loader = acc.prepareDataLoader(Pairs().map(torch::data::transforms::Stack<>()),
                                      mistake == "batch0" ? 0 : 4);
  for (auto& batch : *loader) {
    const bool direct = mistake == "direct_unit" && acc.optimizerSteps() == 1;
    const auto y = direct ? model->layer->forward(batch.data) : model->forward(batch.data);
    acc.backward(torch::mse_loss(y, batch.target));
    if (mistake == "own_step") {
      optimizer.step();
      optimizer.zero_grad();
    } else {
      acc.step();
    }
    if (mistake == "main_only_save" && acc.optimizerSteps() == 2) {
      if (acc.isMainProcess()) acc.saveCheckpoint();
      acc.waitForEveryone();
    }
  }
  acc.print("finished after ", acc.optimizerSteps(), " steps");
}
