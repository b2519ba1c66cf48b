#include "runtime/deferred_init.h"

#include <torch/nn/module.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>

#include "common/error.h"
#include "common/host_memory.h"

namespace cxxlaunch::runtime {
namespace {

thread_local int active_scopes = 0;

struct Pending {
  // A weak reference keeps the TensorImpl's address from being reused while the entry exists,
  // and says whether the parameter still lives.
  c10::weak_intrusive_ptr<c10::TensorImpl> param;
  Initializer init;
};

std::mutex& registryMutex() {
  static std::mutex mu;
  return mu;
}

std::map<const c10::TensorImpl*, Pending>& registry() {
  static std::map<const c10::TensorImpl*, Pending> pending;
  return pending;
}

// The parameter's shape and dtype over one element of memory on `device`: NaN where the dtype
// has it, so that a model used before prepare made its values computes NaN, not garbage.
torch::Tensor placeholder(const torch::Tensor& like, const torch::Device& device) {
  const torch::Tensor one = c10::isFloatingType(like.scalar_type())
                                ? torch::full({1}, std::numeric_limits<double>::quiet_NaN(),
                                              like.options().device(device))
                                : torch::zeros({1}, like.options().device(device));
  const std::vector<int64_t> strides(static_cast<size_t>(like.dim()), 0);
  return torch::empty({0}, one.options()).set_(one.storage(), 0, like.sizes(), strides);
}

}  // namespace

DeferredInit::DeferredInit(bool on) : on_(on) {
  if (on_) ++active_scopes;
}

DeferredInit::~DeferredInit() {
  if (on_) --active_scopes;
}

bool DeferredInit::active() { return active_scopes > 0; }

void initParameter(torch::Tensor& param, Initializer init) {
  torch::NoGradGuard no_grad;
  if (!DeferredInit::active()) {
    init(param);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(registryMutex());
    auto& pending = registry();
    pending.erase(param.unsafeGetTensorImpl());  // an earlier initializer: this one replaces it
    pending.emplace(param.unsafeGetTensorImpl(),
                    Pending{c10::weak_intrusive_ptr<c10::TensorImpl>(param.getIntrusivePtr()),
                            std::move(init)});
  }
  param.set_data(placeholder(param, param.device()));
  // The values a module's constructor made (LibTorch's layers allocate and initialise theirs)
  // go back to the kernel now, not when the heap's top is trimmed: otherwise they pile up in it
  // and building takes the model's memory after all.
  releaseFreedHostMemory();
}

bool isDeferred(const torch::Tensor& param) {
  if (!param.defined()) return false;
  std::lock_guard<std::mutex> lock(registryMutex());
  auto it = registry().find(param.unsafeGetTensorImpl());
  return it != registry().end() && !it->second.param.expired();
}

void materializeInto(const torch::Tensor& param, torch::Tensor values) {
  Initializer init;
  {
    std::lock_guard<std::mutex> lock(registryMutex());
    auto it = registry().find(param.unsafeGetTensorImpl());
    if (it == registry().end() || it->second.param.expired()) {
      throw InvalidArgument("materializeInto: the parameter is not deferred");
    }
    init = std::move(it->second.init);
    registry().erase(it);
  }
  torch::NoGradGuard no_grad;
  init(values);
}

void materialize(torch::Tensor& param) {
  if (!isDeferred(param)) return;
  torch::NoGradGuard no_grad;
  torch::Tensor values = torch::empty(param.sizes(), param.options());
  materializeInto(param, values);
  param.set_data(values);
}

void materialize(torch::nn::Module& module) {
  for (auto& p : module.parameters(/*recurse=*/true)) materialize(p);
}

void moveModule(torch::nn::Module& module, const torch::Device& device) {
  const auto params = module.parameters(/*recurse=*/true);
  if (std::none_of(params.begin(), params.end(), isDeferred)) return module.to(device);
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters(/*recurse=*/true)) {
    if (p.device() == device) continue;
    p.set_data(isDeferred(p) ? placeholder(p, device) : p.to(device));
  }
  for (auto& b : module.buffers(/*recurse=*/true)) {
    if (b.device() != device) b.set_data(b.to(device));
  }
}

}  // namespace cxxlaunch::runtime
