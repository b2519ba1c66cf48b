#pragma once
// The test model of the strategy and checkpoint tests: input and output layers around residual
// blocks (layer norm, linear, tanh) that run through unitForward, so ZeRO-3 has units. With d = 11
// every unit's size is odd, so shards need padding at worlds 2 and 4.

#include <torch/torch.h>

#include <atomic>
#include <string>
#include <vector>

#include "runtime/strategy/unit.h"

namespace cxxlaunch::runtime::testing {

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t d)
      : ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        fc(register_module("fc", torch::nn::Linear(d, d))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    ++forward_calls;
    return x + torch::tanh(fc(ln(x)));
  }
  static inline std::atomic<int64_t> forward_calls{0};
  torch::nn::LayerNorm ln;
  torch::nn::Linear fc;
};
TORCH_MODULE(Block);

struct TowerImpl : torch::nn::Module {
  TowerImpl(int64_t d, int64_t layers)
      : in(register_module("in", torch::nn::Linear(6, d))),
        out(register_module("out", torch::nn::Linear(d, 3))) {
    for (int64_t i = 0; i < layers; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i), Block(d)));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = in(x);
    for (auto& block : blocks) h = unitForward(block, h);
    return out(h);
  }
  torch::nn::Linear in, out;
  std::vector<Block> blocks;
};
TORCH_MODULE(Tower);

}  // namespace cxxlaunch::runtime::testing
