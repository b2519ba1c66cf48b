#include "runtime/state_view.h"

#include <memory>

namespace cxxlaunch::runtime {

StateStream streamOf(std::vector<StateView> views) {
  StateStream stream;
  for (const auto& v : views) {
    StateLayout layout{v.param, v.shape, v.begin, v.end, {}};
    for (const auto& [name, array] : v.arrays) layout.arrays.push_back(name);
    stream.layout.push_back(std::move(layout));
  }
  stream.produce = [views = std::make_shared<std::vector<StateView>>(std::move(views))](
                       const std::function<void(const torch::Tensor&)>& write) {
    for (const auto& v : *views) {
      for (const auto& [name, array] : v.arrays) write(array);
    }
  };
  stream.arrays_stay = true;
  return stream;
}

}  // namespace cxxlaunch::runtime
