// progress_trainer: a small model trained with the Accelerator for the launcher's progress line
// and straggler check (progress_test.cc).
//   progress_trainer [--steps N] [--step_ms MS] [--slow_rank R --slow_ms MS] [--set_total]
//                    [--print_every K] [--exit_at STEP]
// Each step sleeps --step_ms (stand-in for a real step's work), --slow_rank sleeps --slow_ms more.
// The total comes from the LR schedule given to prepare, or with --set_total from
// acc.setTotalSteps; the loss goes to acc.setProgressLoss. --print_every: rank 0 prints a line
// every K steps, which must scroll above the live line. --exit_at: rank 1 exits with code 3 after
// that many steps (a failed run).

#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>

#include "runtime/accelerator.h"

using namespace cxxlaunch::runtime;

int main(int argc, char** argv) {
  int64_t steps = 40, step_ms = 20, slow_ms = 0, print_every = 0, exit_at = -1;
  int slow_rank = -1;
  bool set_total = false;
  for (int i = 1; i < argc; ++i) {
    const bool value = i + 1 < argc;
    if (std::strcmp(argv[i], "--steps") == 0 && value) steps = std::atoll(argv[++i]);
    if (std::strcmp(argv[i], "--step_ms") == 0 && value) step_ms = std::atoll(argv[++i]);
    if (std::strcmp(argv[i], "--slow_rank") == 0 && value) slow_rank = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--slow_ms") == 0 && value) slow_ms = std::atoll(argv[++i]);
    if (std::strcmp(argv[i], "--print_every") == 0 && value) print_every = std::atoll(argv[++i]);
    if (std::strcmp(argv[i], "--exit_at") == 0 && value) exit_at = std::atoll(argv[++i]);
    if (std::strcmp(argv[i], "--set_total") == 0) set_total = true;
  }
  torch::set_num_threads(1);
  Accelerator acc;
  torch::manual_seed(acc.rank());
  torch::nn::Linear model(8, 1);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05));
  LrScheduler schedule(optimizer, LrScheduler::Kind::kLinear, 0, steps);
  if (set_total) {
    acc.setTotalSteps(steps);
    acc.prepare(model.ptr(), optimizer);
  } else {
    acc.prepare(model.ptr(), optimizer, &schedule);
  }
  // A target the model cannot fit exactly: the loss stays above 0.
  const auto inputs = torch::randn({16, 8});
  const auto target = inputs.sum(1, true) + torch::randn({16, 1});
  for (int64_t step = 1; step <= steps; ++step) {
    const int64_t sleep = step_ms + (acc.rank() == slow_rank ? slow_ms : 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep));
    const auto loss = torch::mse_loss(model->forward(inputs), target);
    acc.backward(loss);
    if (acc.step()) acc.setProgressLoss(loss.item<double>());
    if (print_every > 0 && step % print_every == 0 && acc.isMainProcess()) {
      std::cout << "trained " << step << " steps" << std::endl;
    }
    if (step == exit_at && acc.rank() == 1) std::exit(3);
  }
  return 0;
}
