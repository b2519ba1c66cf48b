// The complete trainer of docs/runtime.md, compiled so that the documentation cannot rot.
//   cxxlaunch run --nproc_per_node=2 build/bin/minimal_trainer

#include <torch/torch.h>

#include "runtime/accelerator.h"

using namespace cxxlaunch::runtime;

// y = sum(x): a regression any small network learns.
struct Sums : torch::data::datasets::Dataset<Sums> {
  torch::Tensor x = torch::randn({4096, 32}, at::detail::createCPUGenerator(0));
  torch::data::Example<> get(size_t i) override {
    auto row = x[static_cast<int64_t>(i)];
    return {row, row.sum(0, true)};
  }
  torch::optional<size_t> size() const override { return 4096; }
};

int main() {
  torch::set_num_threads(1);  // one worker per CPU slot
  Accelerator acc;
  torch::manual_seed(0);
  auto model =
      torch::nn::Sequential(torch::nn::Linear(32, 64), torch::nn::ReLU(), torch::nn::Linear(64, 1));
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
  LrScheduler schedule(optimizer, LrScheduler::Kind::kCosine, /*warmup_steps=*/10,
                       /*total_steps=*/200);
  acc.prepare(model.ptr(), optimizer, &schedule);

  auto loader = acc.prepareDataLoader(Sums().map(torch::data::transforms::Stack<>()), 16);
  while (acc.optimizerSteps() < 200) {
    for (auto& batch : *loader) {
      auto loss = torch::mse_loss(model->forward(batch.data), batch.target);
      acc.backward(loss);
      if (acc.step() && acc.optimizerSteps() % 50 == 0) {
        acc.print("step ", acc.optimizerSteps(), " loss ", loss.item<float>());
      }
      if (acc.optimizerSteps() == 200) break;
    }
  }
  acc.print(acc.memoryReport().str());
}
