#pragma once
// Accelerator: what a trainer sees, after HuggingFace accelerate. The same trainer runs as one
// process or as many, on one node or several: only the launch (and its config) changes.
//
//   cxxlaunch::runtime::Accelerator acc;              // reads the launcher's environment
//   acc.prepare(model, optimizer, &scheduler);          // DDP, initial state from rank 0
//   auto loader = acc.prepareDataLoader(dataset, per_device_batch_size);
//   for (auto& batch : *loader) {
//     auto loss = torch::mse_loss(model->forward(batch.data), batch.target);
//     acc.backward(loss);                               // accumulation-aware
//     if (acc.step()) acc.print("loss ", loss.item<double>());   // true after an optimizer step
//   }
//
// Settings (strategy, gradient accumulation, clipping, mixed precision, backend) come from the
// environment the launcher sets (runtime/env_names.h); AcceleratorOptions can override them.
// Rank-0 helpers (print, isMainProcess, mainProcessFirst) make rank-0 I/O the easy path.
//
// Thread-safety: one training thread.

#include <torch/data.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "runtime/strategy/ddp.h"
#include "runtime/scheduler.h"
#include "runtime/world.h"

namespace cxxlaunch::runtime {

struct AcceleratorOptions {
  std::optional<int> gradient_accumulation_steps;  // default: CXXLAUNCH_GRADIENT_ACCUMULATION_STEPS
  std::optional<double> gradient_clipping;         // default: CXXLAUNCH_GRADIENT_CLIPPING
  std::optional<std::string> backend;              // default: CXXLAUNCH_BACKEND
  size_t bucket_bytes = 25u << 20;
  // PyTorch's find_unused_parameters: exact optimizer semantics for parameters no rank used,
  // for one more small collective per step.
  bool find_unused_parameters = false;
};

// Bytes this rank holds (memoryReport()).
struct MemoryReport {
  size_t parameters = 0;
  size_t gradients = 0;
  size_t optimizer_state = 0;
  size_t total() const { return parameters + gradients + optimizer_state; }
  std::string str() const;
};

class Accelerator {
 public:
  // Reads the launcher's environment and connects to the other ranks.
  explicit Accelerator(AcceleratorOptions options = {});
  // Over a given world (tests run ranks as threads over the Fake backend).
  Accelerator(World world, AcceleratorOptions options);
  ~Accelerator();

  int rank() const { return world_.env.rank; }
  int localRank() const { return world_.env.local_rank; }
  int worldSize() const { return world_.env.world_size; }
  bool isMainProcess() const { return rank() == 0; }
  bool isLocalMainProcess() const { return localRank() == 0; }
  int gradientAccumulationSteps() const { return accumulation_steps_; }
  const WorkerEnv& env() const { return world_.env; }
  Backend& backend() { return *world_.backend; }
  torch::Device device() const { return torch::kCPU; }

  // Makes `model` data-parallel (strategy ddp) and remembers the optimizer and scheduler that
  // step() drives. Throws InvalidArgument for a strategy this build cannot run yet.
  void prepare(std::shared_ptr<torch::nn::Module> model, torch::optim::Optimizer& optimizer,
               LrScheduler* scheduler = nullptr);

  // A data loader over this rank's share of `dataset` (torch::data::samplers'
  // DistributedRandomSampler: shuffled, disjoint across ranks): `batch_size` examples per process
  // per micro-step.
  template <typename Dataset>
  auto prepareDataLoader(Dataset dataset, size_t batch_size) {
    torch::data::samplers::DistributedRandomSampler sampler(
        dataset.size().value(), static_cast<size_t>(worldSize()), static_cast<size_t>(rank()),
        /*allow_duplicates=*/true);
    return torch::data::make_data_loader(std::move(dataset), std::move(sampler),
                                         torch::data::DataLoaderOptions(batch_size));
  }

  // loss.backward() for this micro-step: the loss is divided by the accumulation steps, and
  // gradients are only synchronised on the last micro-step of each accumulation cycle.
  void backward(const torch::Tensor& loss);

  // Whether the current micro-step ends an accumulation cycle (gradients are synchronised).
  bool syncGradients() const;

  // At the end of an accumulation cycle: clip (if configured), optimizer step, scheduler step,
  // zero the gradients, and return true. Otherwise only count the micro-step; return false.
  bool step();

  // accelerate's accumulate(): runs one micro-step (`micro_step` returns the loss), then step().
  bool accumulate(const std::function<torch::Tensor()>& micro_step);

  // Scales the gradients so their global L2 norm is at most `max_norm`; returns the norm before.
  double clipGradNorm(double max_norm);

  void waitForEveryone();

  // Runs `work` on the main process first, then on the others (downloads, caches, datasets).
  void mainProcessFirst(const std::function<void()>& work);

  // Every rank's `tensor` concatenated along dim 0, in rank order (same shape on every rank).
  torch::Tensor gather(const torch::Tensor& tensor);

  // Prints on the main process only, one line.
  template <typename... Parts>
  void print(const Parts&... parts) const {
    if (!isMainProcess()) return;
    std::ostringstream line;
    (line << ... << parts);
    std::cout << line.str() << std::endl;
  }

  MemoryReport memoryReport() const;

  // "global batch 64 = 16 per process x 2 processes x 2 accumulation steps"
  std::string describeBatch(size_t per_process_batch) const;

  int64_t optimizerSteps() const { return optimizer_steps_; }

 private:
  World world_;
  int accumulation_steps_ = 1;
  double clipping_ = 0;
  size_t bucket_bytes_;
  bool find_unused_;
  std::shared_ptr<torch::nn::Module> model_;
  torch::optim::Optimizer* optimizer_ = nullptr;
  LrScheduler* scheduler_ = nullptr;
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<DistributedDataParallel::NoSync> no_sync_;
  int64_t micro_step_ = 0;
  int64_t optimizer_steps_ = 0;
};

}  // namespace cxxlaunch::runtime
