#pragma once
// finetune's training loop, HF Trainer's recipe on the Accelerator: the step count from the
// epochs or --max_steps, the LR schedule with its warmup, the loss lines every --logging_steps,
// evaluations, and checkpoints every --save_steps (and at the last step) that a rerun resumes
// from.
//
// Thread-safety: one training thread.

#include <cstdint>
#include <string>

#include "apps/finetune/data.h"
#include "apps/finetune/flags.h"
#include "models/llama.h"
#include "runtime/accelerator.h"

namespace cxxlaunch::finetune {

// The test hook (docs/finetune.md, "How resuming is tested"): with it set to K, the last rank
// exits with code 3 right after optimizer step K (and its save, if one falls there), as a crash
// would, unless the run resumed from a checkpoint: the same command run again goes on.
inline constexpr char kCrashAfterStepEnv[] = "CXXLAUNCH_FINETUNE_CRASH_AFTER_STEP";

// The schedule Trainer derives from the flags.
struct Plan {
  int64_t total_steps = 0;   // optimizer steps
  int64_t warmup_steps = 0;  // of the schedule (0 for "constant")
  runtime::LrScheduler::Kind kind = runtime::LrScheduler::Kind::kLinear;
};

// Trainer's: --max_steps when positive, else ceil(epochs x max(1, batches per epoch /
// accumulation)); warmup_steps when positive, else ceil(total x warmup_ratio). InvalidArgument
// where the warmup is longer than the run.
Plan planOf(const Flags& flags, int64_t batches_per_epoch, int accumulation);

// The mean loss per token whose label is not -100 over every row of `rows`, the same on every
// rank (a collective: every rank runs the same number of forwards).
double evaluate(runtime::Accelerator& acc, models::LlamaForCausalLM& model, const Rows& rows,
                int64_t batch_size);
// "eval loss L perplexity P  (what; <precision> compute)" on rank 0.
void printEval(runtime::Accelerator& acc, double loss, const std::string& what);

// Trains from the Accelerator's current step (0, or a resumed run's) to plan.total_steps.
// `resumed`: whether a checkpoint was loaded (the crash hook stays quiet then).
void train(runtime::Accelerator& acc, models::LlamaForCausalLM& model,
           runtime::LrScheduler& scheduler, const Flags& flags, const Plan& plan,
           const FinetuneData& data, bool resumed);

}  // namespace cxxlaunch::finetune
