#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/torch.h>

#include <optional>

#include "common/error.h"
#include "runtime/precision/policy.h"
#include "runtime/strategy/unit.h"

namespace cxxlaunch::runtime {
namespace {

// The random generators a recomputation must replay: the CPU one, and the input's CUDA device's.
struct RngState {
  std::vector<std::pair<at::Generator, c10::intrusive_ptr<c10::TensorImpl>>> states;

  static RngState capture(const torch::Tensor& input) {
    RngState s;
    auto save = [&](at::Generator gen) {
      std::lock_guard<std::mutex> lock(gen.mutex());
      s.states.emplace_back(gen, gen.get_state().getIntrusivePtr());
    };
    save(at::detail::getDefaultCPUGenerator());
    if (input.is_cuda()) save(at::globalContext().defaultGenerator(input.device()));
    return s;
  }
  // Sets the saved states; returns the ones they replaced.
  RngState swapIn() const {
    RngState previous;
    for (const auto& [gen, state] : states) {
      auto g = gen;
      std::lock_guard<std::mutex> lock(g.mutex());
      previous.states.emplace_back(g, g.get_state().getIntrusivePtr());
      g.set_state(at::Tensor(state));
    }
    return previous;
  }
};

// The backward of a checkpointed forward: runs it again with autograd on and back-propagates
// the incoming gradient through that graph (reentrant backward), which also accumulates the
// parameters' gradients.
class CheckpointBackward final : public torch::autograd::Node {
 public:
  CheckpointBackward(CheckpointedForward forward, torch::Tensor input, RngState rng,
                     c10::DeviceType device, bool autocast, c10::ScalarType autocast_dtype)
      : Node(torch::autograd::collect_next_edges(input)),
        forward_(std::move(forward)),
        input_(input.detach()),
        input_requires_grad_(input.requires_grad()),
        rng_(std::move(rng)),
        device_(device),
        autocast_(autocast),
        autocast_dtype_(autocast_dtype) {}

  std::string name() const override { return "cxxlaunch::CheckpointBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!forward_) {
      throw InvalidArgument(
          "a checkpointed forward's backward ran twice; pass retain_graph only to graphs "
          "without activation checkpointing");
    }
    torch::Tensor input = input_.detach().requires_grad_(input_requires_grad_);
    torch::Tensor output;
    {
      torch::AutoGradMode grad_on(true);
      const RngState previous = rng_.swapIn();
      {
        AutocastScope autocast(device_, autocast_dtype_, autocast_);
        output = forward_(input);
      }
      previous.swapIn();
    }
    if (output.requires_grad()) {
      torch::autograd::backward({output}, {grads[0]});
    }
    forward_ = nullptr;  // the recomputed graph is gone; free what the closure holds
    input_ = torch::Tensor();
    return {input_requires_grad_ ? input.grad() : torch::Tensor()};
  }

  void release_variables() override {
    forward_ = nullptr;
    input_ = torch::Tensor();
  }

 private:
  CheckpointedForward forward_;
  torch::Tensor input_;
  bool input_requires_grad_;
  RngState rng_;
  c10::DeviceType device_;
  bool autocast_;
  c10::ScalarType autocast_dtype_;
};

}  // namespace

torch::Tensor checkpointActivations(CheckpointedForward forward, const torch::Tensor& input) {
  if (!torch::GradMode::is_enabled()) return forward(input);
  const c10::DeviceType device = input.device().type();
  const bool autocast = autocastEnabled(device);
  const c10::ScalarType autocast_dtype = autocastDtype(device);
  RngState rng = RngState::capture(input);
  torch::Tensor output;
  {
    torch::NoGradGuard no_grad;  // no graph, so no activations saved
    output = forward(input);
    // The output gets the recomputation as its history: it must be a tensor of its own.
    if (output.is_view() || output.unsafeGetTensorImpl() == input.unsafeGetTensorImpl()) {
      output = output.clone();
    }
  }
  auto node = std::make_shared<CheckpointBackward>(std::move(forward), input, std::move(rng),
                                                   device, autocast, autocast_dtype);
  torch::autograd::create_gradient_edge(output, std::move(node));
  return output;
}

}  // namespace cxxlaunch::runtime
