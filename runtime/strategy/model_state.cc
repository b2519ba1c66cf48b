#include "runtime/strategy/model_state.h"

#include <torch/torch.h>

#include <vector>

#include "common/error.h"
#include "runtime/comm/tensor_ops.h"
#include "runtime/deferred_init.h"

namespace cxxlaunch::runtime {

void checkSameModel(Backend& backend, const torch::nn::Module& model) {
  // (tensors, elements, a hash of every shape and dtype in registration order)
  int64_t mine[3] = {0, 0, 1469598103934665603LL};
  auto mix = [&](int64_t v) {
    mine[2] = static_cast<int64_t>((static_cast<uint64_t>(mine[2]) ^ static_cast<uint64_t>(v)) *
                                   1099511628211ULL);
  };
  for (const auto& p : model.parameters(/*recurse=*/true)) {
    ++mine[0];
    mine[1] += p.numel();
    mix(static_cast<int64_t>(p.scalar_type()));
    for (int64_t d : p.sizes()) mix(d);
  }
  const int world = backend.worldSize();
  std::vector<int64_t> all(3 * static_cast<size_t>(world));
  backend.allGather(mine, all.data(), 3, DType::kInt64)->wait();
  for (int r = 1; r < world; ++r) {
    const int64_t* theirs = &all[3 * static_cast<size_t>(r)];
    if (theirs[0] == all[0] && theirs[1] == all[1] && theirs[2] == all[2]) continue;
    auto describe = [](const int64_t* f) {
      return std::to_string(f[0]) + " parameter tensors (" + std::to_string(f[1]) + " elements)";
    };
    throw InvalidArgument("the model differs across ranks: rank 0 has " + describe(all.data()) +
                          ", rank " + std::to_string(r) + " has " + describe(theirs) +
                          (theirs[0] == all[0] && theirs[1] == all[1] ? " of other shapes" : "") +
                          "; every rank must build the same model (PyTorch: DDP expects same "
                          "model across all ranks)");
  }
}

void broadcastModuleState(Backend& backend, torch::nn::Module& model, int root) {
  torch::NoGradGuard no_grad;
  std::vector<WorkPtr> works;
  std::vector<torch::Tensor> tensors;
  for (auto& p : model.parameters()) {
    // Deferred parameters have no values yet: a sharded strategy broadcasts them unit by unit.
    if (!isDeferred(p)) tensors.push_back(p);
  }
  for (auto& b : model.buffers()) tensors.push_back(b);
  for (auto& t : tensors) works.push_back(broadcast(backend, t, root));
  for (auto& w : works) w->wait();
}

}  // namespace cxxlaunch::runtime
