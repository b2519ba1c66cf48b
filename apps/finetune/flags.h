#pragma once
// finetune's command line: HF TrainingArguments' flags with their names and defaults
// (docs/finetune.md has the table), today's spellings kept as aliases, and the rule that settles
// a flag against the launch's YAML (gradient accumulation, clipping, the checkpoint folder).
//
// Thread-safety: none needed (no shared state).

#include <cstdint>
#include <optional>
#include <string>

#include "runtime/accelerator.h"
#include "runtime/env.h"

namespace cxxlaunch::finetune {

struct Flags {
  std::string model_dir;
  std::string data;
  std::string output_dir;
  int64_t seq_len = 512;  // a text file's block length
  // A .jsonl's examples (text/sft_data.h), with TRL's SFTConfig names and defaults.
  // The longest example, and a packed row's length; unset: TRL's 1024, at most the model's
  // max_position_embeddings.
  std::optional<int64_t> max_length;
  bool truncation = false;        // cut longer examples to max_length (else refuse them)
  bool packing = false;           // several examples per row (text/packing.h)
  std::string dataset_cache_dir;  // the token cache's folder; "": text/token_cache.h's default
  double eval_fraction = 0.1;
  std::string run_name = "finetune";  // the trackers' run folder (with the launcher's --log_with)

  // TrainingArguments' names and defaults.
  double learning_rate = 5e-5;
  int64_t per_device_train_batch_size = 8;
  int64_t per_device_eval_batch_size = 8;
  double num_train_epochs = 3.0;
  int64_t max_steps = -1;  // > 0 wins over the epochs; 0: evaluate only
  std::string lr_scheduler_type = "linear";
  int64_t warmup_steps = 0;  // wins over warmup_ratio when > 0
  double warmup_ratio = 0;
  double weight_decay = 0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_epsilon = 1e-8;
  std::optional<double> max_grad_norm;                 // given on the command line
  std::optional<int64_t> gradient_accumulation_steps;  // given on the command line
  int64_t logging_steps = 500;
  int64_t eval_steps = 0;    // 0: only before and after training
  int64_t save_steps = 500;  // 0: no checkpoints
  std::optional<int64_t> save_total_limit;
  uint64_t seed = 42;
  std::string resume_from_checkpoint;  // "", "latest" or a checkpoint's path

  // LoRA (apps/finetune/lora.h), PEFT's LoraConfig names and defaults; lora_r 0: a full
  // fine-tune.
  int64_t lora_r = 0;
  double lora_alpha = 8;
  double lora_dropout = 0;
  std::string lora_target_modules = "q_proj,v_proj";  // a comma list, or all-linear
  bool use_rslora = false;
  std::string adapter;  // a PEFT adapter folder put on --model_dir (its settings are the run's)

  bool evaluateOnly() const { return max_steps == 0; }
  bool lora() const { return lora_r > 0 || !adapter.empty(); }
};

// Parses and checks the command line; throws InvalidArgument (exit 2) for a bad one. Exits 0
// after --help.
Flags parseFlags(int argc, char** argv);

// Trainer's defaults where neither the command line nor the launch sets a value.
inline constexpr double kDefaultMaxGradNorm = 1.0;
inline constexpr int64_t kDefaultMaxLength = 1024;  // TRL's SFTConfig

// The Accelerator's settings for `flags` under the launch `env` (docs/finetune.md, "Flags and
// the launch's YAML"):
//   - gradient accumulation and clipping: the flag given on the command line; else the launch's
//     value where it sets one (deepspeed_config.gradient_accumulation_steps / gradient_clipping,
//     or the launcher's flags: a value other than the launcher's default 1 / 0); else Trainer's
//     default (1 / 1.0). A flag and a launch value that disagree are refused (InvalidArgument),
//     as transformers refuses a DeepSpeed config that disagrees with TrainingArguments;
//   - checkpoints: in the launch's --checkpoint_dir, else in --output_dir, named as Trainer names
//     them (checkpoint-<step>); kept to --save_total_limit, else the launch's
//     --checkpoint_total_limit, else all of them; written asynchronously where the launch says
//     so (--checkpoint_async, which the Accelerator reads itself).
runtime::AcceleratorOptions acceleratorOptions(const Flags& flags, const runtime::WorkerEnv& env);

}  // namespace cxxlaunch::finetune
