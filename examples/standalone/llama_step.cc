// A model trainer outside the cxxlaunch repository: loads the Hugging Face folder given as its
// one argument (config.json + safetensors, e.g. from the installed llama_init) into the models/
// Llama, trains it for a few steps on a fixed token sequence and prints, from rank 0 only,
// "llama_step: world <N> steps <S> loss <first> -> <last>". It names cxxlaunch::cxxlaunch, the
// package's one target, which brings models/ with the runtime.
//   cxxlaunch run --nproc_per_node=2 --cpu ./standalone_llama_step MODEL_DIR

#include <torch/torch.h>

#include <iostream>

#include "models/llama.h"
#include "runtime/accelerator.h"

using cxxlaunch::models::LlamaConfig;
using cxxlaunch::models::LlamaForCausalLM;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: standalone_llama_step MODEL_DIR\n";
    return 2;
  }
  const std::string dir = argv[1];
  torch::set_num_threads(1);
  cxxlaunch::runtime::Accelerator acc;
  torch::manual_seed(0);
  const LlamaConfig config = LlamaConfig::fromFile(dir + "/config.json");
  LlamaForCausalLM model(config);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  acc.prepare(model.ptr(), optimizer);
  acc.loadModel(dir);

  // The same 32 tokens on every rank and step: the loss must fall.
  const auto tokens = torch::arange(32, torch::kLong).remainder(config.vocab_size).view({1, 32});
  constexpr int kSteps = 8;
  float first = 0, last = 0;
  for (int step = 0; step < kSteps; ++step) {
    auto loss = cxxlaunch::models::causalLmLoss(model->forward(tokens), tokens);
    acc.backward(loss);
    acc.step();
    last = loss.item<float>();
    if (step == 0) first = last;
  }
  acc.print("llama_step: world ", acc.worldSize(), " steps ", acc.optimizerSteps(), " loss ", first,
            " -> ", last);
  return 0;
}
