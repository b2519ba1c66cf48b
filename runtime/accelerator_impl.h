#pragma once
// Accelerator::Impl: what the Accelerator holds behind its public header (runtime/accelerator.h),
// for its two sources (accelerator.cc, accelerator_checkpoint.cc). The engine (World, the
// strategy, the loss scaler, the trackers) and the run's counters stay out of the installed
// headers.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/accelerator.h"
#include "runtime/checkpoint/async_save.h"
#include "runtime/observability/trackers.h"
#include "runtime/precision/loss_scaler.h"
#include "runtime/precision/policy.h"
#include "runtime/strategy/strategy.h"
#include "runtime/world.h"

namespace cxxlaunch::runtime {

struct Accelerator::Impl {
  World world;
  int accumulation_steps = 1;
  double clipping = 0;
  size_t bucket_bytes = 0;
  bool find_unused = false;
  LrScheduler* scheduler = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;  // the trainer's, from prepare on
  std::shared_ptr<torch::nn::Module> model;      // its buffers go into checkpoints
  std::string checkpoint_dir;
  std::string checkpoint_prefix;  // checkpoint_ or checkpoint-
  std::string model_source;       // the folder loadModel read (absolute), for checkpoints to name
  std::string base_fingerprint;   // its fingerprint, when it gave frozen parameters their values
  int64_t checkpoint_total_limit = 0;
  std::unique_ptr<checkpoint::AsyncSaver> async_saver;  // with checkpoint_async
  bool prune_when_committed = false;                    // the save in flight is saveCheckpoint's
  bool snapshot_reserved = false;
  std::vector<checkpoint::SaveReport> save_reports;
  std::vector<const torch::nn::Module*> wrapped;
  std::vector<const torch::nn::Module*> checkpointed;  // unmarked when this ends
  PrecisionPolicy precision;
  std::optional<LossScaler> scaler;
  std::unique_ptr<AutocastScope> autocast;  // from prepare on, with mixed precision
  bool step_was_skipped = false;
  std::unique_ptr<Strategy> strategy;
  int64_t micro_step = 0;
  int64_t optimizer_steps = 0;
  bool backward_pending = false;  // a backward() that no step() followed yet
  // The micro-steps of the loaded run, until a loader takes them.
  std::optional<int64_t> resume_position;
  std::shared_ptr<EvalPosition> eval_position = std::make_shared<EvalPosition>();
  std::vector<std::string> log_with;
  std::string project_dir;
  int report_every = 10;
  std::unique_ptr<Trackers> trackers;  // main process, from initTrackers on
};

}  // namespace cxxlaunch::runtime
