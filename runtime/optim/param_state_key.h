#pragma once
// The key torch::optim's state map gives a parameter: a string of the TensorImpl's address in
// LibTorch 1.13 (c10::guts::to_string of the pointer), the pointer itself in later releases.
// Internal to runtime/.

#include <torch/types.h>

#include <sstream>
#include <type_traits>

namespace cxxlaunch::runtime {

template <typename StateMap>
typename StateMap::key_type paramStateKey(const StateMap&, const torch::Tensor& param) {
  if constexpr (std::is_same_v<typename StateMap::key_type, std::string>) {
    std::ostringstream key;
    key << param.unsafeGetTensorImpl();
    return key.str();
  } else {
    return param.unsafeGetTensorImpl();
  }
}

}  // namespace cxxlaunch::runtime
