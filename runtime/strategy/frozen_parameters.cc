#include "runtime/strategy/frozen_parameters.h"

#include <torch/torch.h>

#include "runtime/deferred_init.h"

namespace cxxlaunch::runtime {

void materializeParameters(torch::nn::Module& model, bool trainable, c10::ScalarType frozen_dtype) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters(/*recurse=*/true)) {
    if (p.requires_grad()) {
      if (trainable) materialize(p);
      continue;
    }
    if (p.scalar_type() == frozen_dtype || !p.is_floating_point()) {
      materialize(p);
      continue;
    }
    torch::Tensor values = p;
    if (isDeferred(p)) {  // the initializer writes the parameter's own dtype
      values = torch::empty(p.sizes(), p.options());
      materializeInto(p, values);
    }
    p.set_data(values.to(frozen_dtype));
  }
}

}  // namespace cxxlaunch::runtime
