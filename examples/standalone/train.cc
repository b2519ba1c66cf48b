// A trainer outside the cxxlaunch repository: a small MLP learns y = sum(x) data-parallel. The
// same binary runs alone (a world of 1) or under the launcher:
//   cxxlaunch run --nproc_per_node=2 --cpu ./standalone_train
// and prints, from rank 0 only, "standalone: world <N> steps <S> final loss <L>".

#include <torch/torch.h>

#include "runtime/accelerator.h"

namespace {

constexpr int64_t kFeatures = 16;
constexpr int64_t kSamples = 1024;
constexpr int kSteps = 100;

// y = sum(x): a regression any small network learns in a few dozen steps.
struct Sums : torch::data::datasets::Dataset<Sums> {
  torch::Tensor x = torch::randn({kSamples, kFeatures}, at::detail::createCPUGenerator(0));
  torch::data::Example<> get(size_t i) override {
    auto row = x[static_cast<int64_t>(i)];
    return {row, row.sum(0, true)};
  }
  torch::optional<size_t> size() const override { return kSamples; }
};

}  // namespace

int main() {
  torch::set_num_threads(1);  // one worker per CPU slot
  cxxlaunch::runtime::Accelerator acc;
  torch::manual_seed(0);
  auto model = torch::nn::Sequential(torch::nn::Linear(kFeatures, 32), torch::nn::ReLU(),
                                     torch::nn::Linear(32, 1));
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
  acc.prepare(model.ptr(), optimizer);

  auto loader = acc.prepareDataLoader(Sums().map(torch::data::transforms::Stack<>()), 16);
  float loss_value = 0;
  while (acc.optimizerSteps() < kSteps) {
    for (auto& batch : *loader) {
      auto loss = torch::mse_loss(model->forward(batch.data), batch.target);
      acc.backward(loss);
      acc.step();
      loss_value = loss.item<float>();
      if (acc.optimizerSteps() == kSteps) break;
    }
  }
  acc.print("standalone: world ", acc.worldSize(), " steps ", acc.optimizerSteps(), " final loss ",
            loss_value);
  return 0;
}
