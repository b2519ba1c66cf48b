#include "apps/finetune/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <vector>

#include "apps/examples/step_scalars.h"
#include "common/error.h"
#include "models/chunked_loss.h"

namespace cxxlaunch::finetune {

using runtime::Accelerator;
using runtime::LrScheduler;
using Clock = std::chrono::steady_clock;

Plan planOf(const Flags& f, int64_t batches_per_epoch, int accumulation) {
  Plan plan;
  if (f.max_steps > 0) {
    plan.total_steps = f.max_steps;
  } else {
    // Trainer's num_update_steps_per_epoch: the loader's batches per accumulation, at least 1.
    const int64_t per_epoch = std::max<int64_t>(1, batches_per_epoch / accumulation);
    plan.total_steps =
        static_cast<int64_t>(std::ceil(f.num_train_epochs * static_cast<double>(per_epoch) - 1e-9));
    plan.total_steps = std::max<int64_t>(plan.total_steps, 1);
  }
  plan.kind = f.lr_scheduler_type == "cosine"   ? LrScheduler::Kind::kCosine
              : f.lr_scheduler_type == "linear" ? LrScheduler::Kind::kLinear
                                                : LrScheduler::Kind::kConstant;
  // "constant" has no warmup in Trainer (get_constant_schedule), whatever the warmup flags say.
  if (f.lr_scheduler_type != "constant") {
    plan.warmup_steps = f.warmup_steps > 0
                            ? f.warmup_steps
                            : static_cast<int64_t>(std::ceil(
                                  static_cast<double>(plan.total_steps) * f.warmup_ratio - 1e-9));
  }
  if (plan.warmup_steps > plan.total_steps) {
    throw InvalidArgument("--warmup_steps " + std::to_string(plan.warmup_steps) +
                          " is more than the run's " + std::to_string(plan.total_steps) +
                          " optimizer steps; give fewer, or more steps");
  }
  return plan;
}

// Rank r takes rows r, r + W, r + 2W, ...: each row once, none twice (a prepared loader would
// pad with repeats). Every rank runs the same number of forward passes, since under ZeRO-3 /
// FULL_SHARD a forward is a collective: a rank whose share ran out runs row 0 and does not count
// it.
namespace {

// The positions a packed batch's rows give the model (its attention then stays inside each
// example); undefined for unpacked rows, whose positions are 0..T-1 anyway.
torch::Tensor positionsOf(const Rows& rows, const torch::Device& device) {
  return rows.packed ? rows.position_ids.to(device) : torch::Tensor();
}

}  // namespace

double evaluate(Accelerator& acc, models::LlamaForCausalLM& model, const Rows& rows,
                int64_t batch_size) {
  torch::NoGradGuard no_grad;
  // Evaluation mode (LoRA's dropout off), back to training mode however this returns.
  model->eval();
  struct BackToTraining {
    models::LlamaForCausalLM& model;
    ~BackToTraining() { model->train(); }
  } back{model};
  const int64_t n = rows.size(), world = acc.worldSize(), rank = acc.rank();
  const int64_t rounds = ((n + world - 1) / world + batch_size - 1) / batch_size;
  double sum = 0, count = 0;
  for (int64_t round = 0; round < rounds; ++round) {
    std::vector<int64_t> mine;
    for (int64_t j = 0; j < batch_size; ++j) {
      const int64_t i = rank + world * (round * batch_size + j);
      if (i < n) mine.push_back(i);
    }
    if (mine.empty()) {
      (void)model->forward(rows.input_ids.narrow(0, 0, 1).to(acc.device()));
      continue;
    }
    const Rows batch = rows.select(torch::tensor(mine, torch::kLong));
    const torch::Tensor labels = batch.labels.to(acc.device());
    // Token-weighted: the loss's mean times the tokens it averaged (labels past the first).
    const auto tokens =
        labels.narrow(1, 1, labels.size(1) - 1).ne(kIgnoreIndex).sum().item<int64_t>();
    if (tokens == 0) {
      (void)model->forward(batch.input_ids.to(acc.device()));
      continue;
    }
    const torch::Tensor logits =
        model->forward(batch.input_ids.to(acc.device()), {}, positionsOf(batch, acc.device()));
    sum += models::causalLmLoss(logits, labels).item<double>() * static_cast<double>(tokens);
    count += static_cast<double>(tokens);
  }
  const auto total = acc.gather(torch::tensor({sum, count}, torch::kDouble)).view({-1, 2}).sum(0);
  return total[0].item<double>() / total[1].item<double>();
}

// The line names the compute precision: the same weights evaluated in bf16 and in fp32 differ
// in the fourth decimal (docs/finetune.md, "The eval figures").
void printEval(Accelerator& acc, double loss, const std::string& what) {
  char line[320];
  std::snprintf(line, sizeof(line), "eval loss %.4f perplexity %.3f  (%s; %s compute)", loss,
                std::exp(loss), what.c_str(),
                acc.precision().mixed() ? acc.precision().name.c_str() : "fp32");
  acc.print(line);
}

namespace {

// The step after which the crash hook fires, or 0.
int64_t crashAfterStep() {
  const char* value = std::getenv(kCrashAfterStepEnv);  // NOLINT(concurrency-mt-unsafe)
  return value != nullptr ? std::atoll(value) : 0;
}

// Every save once committed: at once when synchronous; with --checkpoint_async at the step, save
// or end that committed it.
void printSaves(Accelerator& acc) {
  for (const auto& s : acc.takeSaveReports()) {
    char text[96];
    std::snprintf(text, sizeof(text), "%.3f GB in %.3f s, training blocked %.3f s",
                  static_cast<double>(s.bytes) / 1e9, s.seconds, s.blocked_seconds);
    acc.print("saved ", s.dir, " (", text, ")");
  }
}

// What the loss line and the trackers average: the micro-steps since the last line (the
// console) and since the last optimizer step (the trackers).
struct Window {
  double loss_sum = 0;
  int64_t losses = 0, rows = 0;
  void add(double loss, int64_t batch_rows) {
    loss_sum += loss;
    ++losses;
    rows += batch_rows;
  }
  double mean() const { return loss_sum / static_cast<double>(losses); }
};

}  // namespace

void train(Accelerator& acc, models::LlamaForCausalLM& model, LrScheduler& scheduler,
           const Flags& f, const Plan& plan, const FinetuneData& data, bool resumed) {
  const auto batch_size = static_cast<size_t>(f.per_device_train_batch_size);
  const int64_t seq_len = data.train.input_ids.size(1);
  auto loader = acc.prepareDataLoader(RowsDataset(data.train), batch_size);
  const int64_t crash_after = crashAfterStep();
  const int64_t first_step = acc.optimizerSteps() + 1;
  auto last_line = Clock::now();
  auto step_start = last_line;
  Window line, step_window;
  int64_t line_first = first_step;
  while (acc.optimizerSteps() < plan.total_steps) {
    for (auto& examples : *loader) {
      Rows batch = stack(examples);
      batch.packed = data.train.packed;
      const torch::Tensor ids = batch.input_ids.to(acc.device());
      const torch::Tensor labels = batch.labels.to(acc.device());
      // The LM head and the loss chunk by chunk: the [tokens, vocabulary] logits never exist
      // (models/chunked_loss.h). Evaluation keeps the plain path.
      const torch::Tensor loss =
          models::chunkedCausalLmLoss(model, ids, labels, {}, positionsOf(batch, acc.device()));
      const double loss_value = loss.item<double>();
      line.add(loss_value, ids.size(0));
      step_window.add(loss_value, ids.size(0));
      acc.backward(loss);
      if (!acc.step()) continue;
      const int64_t step = acc.optimizerSteps();
      // The schedule's lr from here on, as Trainer logs it (after the scheduler's step).
      const double lr = scheduler.factor() * f.learning_rate;
      if (!acc.trackerNames().empty()) {
        const auto now = Clock::now();
        const double step_s = std::chrono::duration<double>(now - step_start).count();
        acc.log(examples::stepScalars(
                    step_window.mean(), lr,
                    static_cast<double>(step_window.rows * seq_len * acc.worldSize()) / step_s,
                    step_s, acc.memoryReport()),
                step);
      }
      acc.setProgressLoss(step_window.mean());
      step_window = {};
      step_start = Clock::now();
      if (step % f.logging_steps == 0 || step == plan.total_steps) {
        const auto now = Clock::now();
        const double seconds = std::chrono::duration<double>(now - last_line).count();
        const double tokens_per_s =
            static_cast<double>(line.rows * seq_len * acc.worldSize()) / seconds;
        // The loss printed is the mean over rank 0's micro-batches since the last line, which
        // says so when it spans several steps; the trackers get each step's own.
        char window[64] = "";
        if (line_first < step) {
          std::snprintf(window, sizeof(window), " (mean of steps %lld-%lld)",
                        static_cast<long long>(line_first), static_cast<long long>(step));
        }
        char text[320];
        std::snprintf(text, sizeof(text),
                      "step %4lld/%lld  loss %.4f%s  lr %.2e  %.0f tokens/s  (%s)",
                      static_cast<long long>(step), static_cast<long long>(plan.total_steps),
                      line.mean(), window, lr, tokens_per_s, acc.describeBatch(batch_size).c_str());
        acc.print(text);
        line_first = step + 1;
        last_line = now;
        line = {};
      }
      if (f.eval_steps > 0 && step % f.eval_steps == 0 && step < plan.total_steps) {
        const double eval = evaluate(acc, model, data.eval, f.per_device_eval_batch_size);
        printEval(acc, eval, "at step " + std::to_string(step));
        acc.log({{"eval/loss", eval}}, step);
      }
      // Trainer saves every save_steps and at the last step.
      if (f.save_steps > 0 && (step % f.save_steps == 0 || step == plan.total_steps)) {
        acc.saveCheckpoint();
      }
      printSaves(acc);
      if (step == crash_after && !resumed && acc.rank() == acc.worldSize() - 1) {
        std::cerr << "finetune: " << kCrashAfterStepEnv << "=" << step
                  << ": exiting as a crash would\n";
        std::_Exit(3);
      }
      if (step >= plan.total_steps) break;
    }
  }
  acc.waitForCheckpoint();
  printSaves(acc);
}

}  // namespace cxxlaunch::finetune
