#pragma once
// ForwardOrder: the order the units ran in this forward and in the previous one, which is what
// prefetching knows of the graph: backward gathers next the unit that ran before in this forward
// (the next in backward order); forward prefetch the one that followed in the previous forward
// (a static graph runs in the same order every step). Passes without autograd (evaluation) have
// no backward and are not recorded.
//
// Thread-safety: none; the strategy's lock guards it.

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace cxxlaunch::runtime {

class ForwardOrder {
 public:
  static constexpr size_t kNone = static_cast<size_t>(-1);

  // `unit` starts its forward; the first since the last backward ended starts a new order.
  void record(size_t unit) {
    if (!in_forward_) {
      in_forward_ = true;
      previous_ = std::move(current_);
      current_.clear();
    }
    current_.push_back(unit);
  }
  // A backward ended: the next record starts the next forward.
  void backwardEnded() { in_forward_ = false; }

  size_t beforeInThisForward(size_t unit) const {
    auto it = std::find(current_.begin(), current_.end(), unit);
    return it == current_.end() || it == current_.begin() ? kNone : *(it - 1);
  }
  size_t afterInPreviousForward(size_t unit) const {
    auto it = std::find(previous_.begin(), previous_.end(), unit);
    return it == previous_.end() || it + 1 == previous_.end() ? kNone : *(it + 1);
  }

 private:
  std::vector<size_t> current_, previous_;
  bool in_forward_ = false;
};

}  // namespace cxxlaunch::runtime
