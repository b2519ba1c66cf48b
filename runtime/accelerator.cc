#include "runtime/accelerator.h"

#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstdio>

#include "rendezvous/error.h"
#include "runtime/host_memory.h"
#include "runtime/tensor_ops.h"

namespace cxxlaunch::runtime {
namespace {

WorkerEnv withOverrides(WorkerEnv env, const AcceleratorOptions& options) {
  if (options.gradient_accumulation_steps) {
    env.gradient_accumulation_steps = *options.gradient_accumulation_steps;
  }
  if (options.gradient_clipping) env.gradient_clipping = *options.gradient_clipping;
  if (options.backend) env.backend = *options.backend;
  return env;
}

size_t bytesOf(const torch::Tensor& t) {
  return t.defined() ? static_cast<size_t>(t.numel()) * t.element_size() : 0;
}

std::string humanBytes(size_t bytes) {
  char text[32];
  if (bytes < (1u << 20)) {
    std::snprintf(text, sizeof(text), "%.1f KiB", static_cast<double>(bytes) / 1024);
  } else {
    std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  }
  return text;
}

}  // namespace

std::string MemoryReport::str() const {
  return "parameters " + humanBytes(parameters) + ", gradients " + humanBytes(gradients) + ", optimizer state " +
         humanBytes(optimizer_state) + ", total " + humanBytes(total());
}

Accelerator::Accelerator(AcceleratorOptions options)
    : Accelerator(World{withOverrides(readWorkerEnv(), options), nullptr, nullptr}, options) {}

Accelerator::Accelerator(World world, AcceleratorOptions options)
    : world_(std::move(world)),
      bucket_bytes_(options.bucket_bytes),
      find_unused_(options.find_unused_parameters) {
  if (world_.env.gradient_accumulation_steps < 1) {
    throw InvalidArgument("gradient accumulation steps must be >= 1");
  }
  if (world_.env.strategy != "ddp") {
    throw InvalidArgument("strategy '" + world_.env.strategy +
                          "' is not available in this build yet; use ddp");
  }
  if (world_.env.mixed_precision != "no") {
    throw InvalidArgument("mixed precision '" + world_.env.mixed_precision +
                          "' is not available in this build yet; use no");
  }
  keepFreedHostMemory();
  accumulation_steps_ = world_.env.gradient_accumulation_steps;
  clipping_ = world_.env.gradient_clipping;
  if (!world_.backend) {
    if (!world_.store) world_.store = storeFromEnv(world_.env);
    world_.backend = backendFromEnv(world_.env, world_.store);
  }
}

Accelerator::~Accelerator() = default;

void Accelerator::prepare(std::shared_ptr<torch::nn::Module> model,
                          torch::optim::Optimizer& optimizer, LrScheduler* scheduler) {
  model_ = std::move(model);
  optimizer_ = &optimizer;
  scheduler_ = scheduler;
  DdpOptions ddp_options;
  ddp_options.bucket_bytes = bucket_bytes_;
  ddp_options.find_unused_parameters = find_unused_;
  ddp_ = std::make_unique<DistributedDataParallel>(model_, world_.backend, ddp_options);
}

bool Accelerator::syncGradients() const { return (micro_step_ + 1) % accumulation_steps_ == 0; }

void Accelerator::backward(const torch::Tensor& loss) {
  if (!ddp_) throw InvalidArgument("Accelerator::backward before prepare(model, optimizer)");
  const bool sync = syncGradients();
  if (!sync && !no_sync_) no_sync_ = std::make_unique<DistributedDataParallel::NoSync>(*ddp_);
  if (sync) no_sync_.reset();
  const torch::Tensor scaled = accumulation_steps_ > 1 ? loss / accumulation_steps_ : loss;
  scaled.backward();
  if (sync) ddp_->finishBackward();
}

bool Accelerator::step() {
  if (!optimizer_) throw InvalidArgument("Accelerator::step before prepare(model, optimizer)");
  const bool sync = syncGradients();
  ++micro_step_;
  if (!sync) return false;
  if (clipping_ > 0) clipGradNorm(clipping_);
  optimizer_->step();
  if (scheduler_ != nullptr) scheduler_->step();
  optimizer_->zero_grad();
  ++optimizer_steps_;
  return true;
}

bool Accelerator::accumulate(const std::function<torch::Tensor()>& micro_step) {
  backward(micro_step());
  return step();
}

double Accelerator::clipGradNorm(double max_norm) {
  // After DDP's all-reduce every rank holds the same full gradients: the local norm is global.
  std::vector<torch::Tensor> params;
  for (auto& p : model_->parameters()) {
    if (p.grad().defined()) params.push_back(p);
  }
  return torch::nn::utils::clip_grad_norm_(params, max_norm);
}

void Accelerator::waitForEveryone() { world_.backend->barrier()->wait(); }

void Accelerator::mainProcessFirst(const std::function<void()>& work) {
  if (!isMainProcess()) waitForEveryone();
  work();
  if (isMainProcess()) waitForEveryone();
}

torch::Tensor Accelerator::gather(const torch::Tensor& tensor) {
  auto input = tensor.contiguous();
  std::vector<int64_t> shape = input.sizes().vec();
  if (shape.empty()) shape.push_back(1);
  shape[0] *= worldSize();
  auto output = torch::empty(shape, input.options());
  world_.backend
      ->allGather(input.data_ptr(), output.data_ptr(), static_cast<size_t>(input.numel()),
                  dtypeOf(input))
      ->wait();
  return output;
}

MemoryReport Accelerator::memoryReport() const {
  MemoryReport report;
  if (model_) {
    for (const auto& p : model_->parameters()) {
      report.parameters += bytesOf(p);
      report.gradients += bytesOf(p.grad());
    }
  }
  if (optimizer_ != nullptr) {
    for (const auto& [key, state] : optimizer_->state()) {
      if (auto* adamw = dynamic_cast<torch::optim::AdamWParamState*>(state.get())) {
        report.optimizer_state += bytesOf(adamw->exp_avg()) + bytesOf(adamw->exp_avg_sq()) +
                                  bytesOf(adamw->max_exp_avg_sq());
      } else if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(state.get())) {
        report.optimizer_state += bytesOf(adam->exp_avg()) + bytesOf(adam->exp_avg_sq()) +
                                  bytesOf(adam->max_exp_avg_sq());
      } else if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(state.get())) {
        report.optimizer_state += bytesOf(sgd->momentum_buffer());
      }
    }
  }
  return report;
}

std::string Accelerator::describeBatch(size_t per_process_batch) const {
  return "global batch " +
         std::to_string(per_process_batch * static_cast<size_t>(worldSize()) *
                        static_cast<size_t>(accumulation_steps_)) +
         " = " + std::to_string(per_process_batch) + " per process x " +
         std::to_string(worldSize()) + " processes x " + std::to_string(accumulation_steps_) +
         " accumulation steps";
}

}  // namespace cxxlaunch::runtime
