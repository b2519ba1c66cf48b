#include "apps/finetune/flags.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "apps/finetune/data.h"
#include "common/command_line.h"
#include "common/error.h"

namespace cxxlaunch::finetune {

namespace {

std::string text(double value) {
  char out[32];
  std::snprintf(out, sizeof(out), "%g", value);
  return out;
}

void requireFinite(double value, const char* flag, bool positive) {
  if (!std::isfinite(value) || (positive ? !(value > 0) : value < 0)) {
    throw InvalidArgument(std::string("need a finite --") + flag + (positive ? " > 0" : " >= 0") +
                          " (got " + text(value) + ")");
  }
}

}  // namespace

Flags parseFlags(int argc, char** argv) {
  Flags f;
  CLI::App app(
      "Fine-tunes a Hugging Face Llama/Qwen2/Mistral folder on a text file, with HF Trainer's "
      "recipe (TrainingArguments' flags and defaults).",
      "finetune");
  cli::useConventions(app);
  auto add = [&](const char* names, auto& value, const char* help) {
    return app.add_option(cli::spellings(names), value, help)->capture_default_str();
  };
  add("model_dir", f.model_dir, "the HF model folder (config.json, safetensors)")->required();
  add("data", f.data, "a text file to train and evaluate on")->required();
  add("output_dir", f.output_dir,
      "where the fine-tuned HF folder goes, and this run's checkpoints (checkpoint-<step>)");
  auto* seq_len_flag = add("seq_len", f.seq_len, "a text file's tokens per block");
  int64_t max_length = kDefaultMaxLength;
  auto* max_length_flag =
      add("max_length", max_length,
          "a .jsonl's longest example in tokens, and a packed row's length (default 1024, at "
          "most the model's max_position_embeddings)");
  app.add_flag(cli::spellings("truncation"), f.truncation,
               "cut a .jsonl example longer than --max_length to its first --max_length tokens "
               "(without it such an example is an error)");
  app.add_flag(cli::spellings("packing"), f.packing,
               "pack several .jsonl examples per row of --max_length tokens, each attending "
               "only to itself");
  add("dataset_cache_dir", f.dataset_cache_dir,
      "the token cache's folder (default $XDG_CACHE_HOME/cxxlaunch/tokens, else "
      "~/.cache/cxxlaunch/tokens)");
  add("eval_fraction", f.eval_fraction, "the last fraction of the blocks, held out for eval");
  add("run_name", f.run_name, "the trackers' run folder under --project_dir (with --log_with)");
  add("learning_rate,lr", f.learning_rate, "AdamW's peak learning rate");
  add("per_device_train_batch_size,batch_size", f.per_device_train_batch_size,
      "blocks per process per micro-step");
  add("per_device_eval_batch_size", f.per_device_eval_batch_size,
      "blocks per process per evaluation forward");
  add("num_train_epochs", f.num_train_epochs,
      "passes over the training blocks (when --max_steps is not positive)");
  add("max_steps,steps", f.max_steps,
      "optimizer steps; > 0 wins over --num_train_epochs; 0: load, evaluate and exit");
  add("lr_scheduler_type", f.lr_scheduler_type, "linear, cosine, constant or constant_with_warmup");
  add("warmup_steps", f.warmup_steps, "linear warmup steps (win over --warmup_ratio when > 0)");
  add("warmup_ratio", f.warmup_ratio, "warmup as a fraction of the optimizer steps");
  add("weight_decay", f.weight_decay, "AdamW's decoupled weight decay (not on biases and norms)");
  add("adam_beta1", f.adam_beta1, "AdamW's beta1");
  add("adam_beta2", f.adam_beta2, "AdamW's beta2");
  add("adam_epsilon", f.adam_epsilon, "AdamW's epsilon");
  double max_grad_norm = kDefaultMaxGradNorm;
  auto* clip = add("max_grad_norm", max_grad_norm,
                   "clip the gradients' global norm to this; 0: no clipping (default: the "
                   "launch's gradient_clipping, else 1.0)");
  int64_t accumulation = 1;
  auto* accumulate = add("gradient_accumulation_steps", accumulation,
                         "micro-steps per optimizer step (default: the launch's, else 1)");
  add("logging_steps,print_every", f.logging_steps,
      "optimizer steps between loss lines (the mean loss since the last one)");
  add("eval_steps", f.eval_steps,
      "optimizer steps between evaluations besides those before and after training; 0: none");
  add("save_steps", f.save_steps,
      "optimizer steps between checkpoints (and one at the last step); 0: none");
  int64_t total_limit = 0;
  auto* limit = add("save_total_limit", total_limit,
                    "keep the newest this many checkpoints (default: the launch's "
                    "--checkpoint_total_limit, else all)");
  add("seed", f.seed, "random seed (the data order)");
  add("resume_from_checkpoint", f.resume_from_checkpoint,
      "'latest': the newest checkpoint (one is required), or a checkpoint's path; without it a "
      "run resumes from the newest checkpoint there is");
  auto* lora_r = add("lora_r", f.lora_r,
                     "LoRA's rank: train low-rank adapters on a frozen base and write them in "
                     "PEFT's layout; 0: a full fine-tune");
  auto* lora_alpha = add("lora_alpha", f.lora_alpha, "LoRA's alpha: the term's scale is alpha / r");
  auto* lora_dropout =
      add("lora_dropout", f.lora_dropout, "dropout on the adapters' input while training");
  auto* lora_targets = add("lora_target_modules", f.lora_target_modules,
                           "the Linear modules that get adapters, a comma list (q_proj, k_proj, "
                           "v_proj, o_proj, gate_proj, up_proj, down_proj) or all-linear");
  auto* rslora = app.add_flag(cli::spellings("use_rslora"), f.use_rslora,
                              "scale the LoRA term by alpha / sqrt(r) (rank-stabilised LoRA)");
  add("adapter", f.adapter,
      "a PEFT LoRA adapter folder (adapter_config.json, adapter_model.safetensors) put on "
      "--model_dir: evaluated with --max_steps 0, or trained further");
  cli::parseOrExit(app, argc, argv);
  const bool lora_settings =
      lora_alpha->count() + lora_dropout->count() + lora_targets->count() + rslora->count() > 0;
  if (clip->count() > 0) f.max_grad_norm = max_grad_norm;
  if (accumulate->count() > 0) f.gradient_accumulation_steps = accumulation;
  if (limit->count() > 0) f.save_total_limit = total_limit;
  if (max_length_flag->count() > 0) f.max_length = max_length;
  // Each kind of data has its own length flags: one given for the other kind would do nothing.
  const bool jsonl = isJsonLines(f.data);
  if (!jsonl && (f.packing || f.truncation || f.max_length)) {
    throw InvalidArgument(
        "--max_length, --truncation and --packing apply to JSON-lines data (a .jsonl file); "
        "--data '" +
        f.data + "' is text, cut into blocks of --seq_len");
  }
  if (jsonl && seq_len_flag->count() > 0) {
    throw InvalidArgument("--seq_len cuts a text file into blocks; --data '" + f.data +
                          "' is JSON lines, whose examples --max_length bounds (and --packing "
                          "packs into rows of --max_length)");
  }

  requireFinite(f.learning_rate, "learning_rate", true);
  requireFinite(f.num_train_epochs, "num_train_epochs", true);
  requireFinite(f.warmup_ratio, "warmup_ratio", false);
  requireFinite(f.weight_decay, "weight_decay", false);
  requireFinite(f.adam_epsilon, "adam_epsilon", true);
  if (f.max_grad_norm) requireFinite(*f.max_grad_norm, "max_grad_norm", false);
  for (const auto& [value, name] :
       {std::pair{f.adam_beta1, "adam_beta1"}, {f.adam_beta2, "adam_beta2"}}) {
    if (!(value >= 0 && value < 1)) {
      throw InvalidArgument(std::string("--") + name + " must be in [0, 1) (got " + text(value) +
                            ")");
    }
  }
  if (f.warmup_ratio > 1) throw InvalidArgument("--warmup_ratio must be in [0, 1]");
  if (f.max_steps < -1)
    throw InvalidArgument("--max_steps must be -1 (from the epochs), 0 or more");
  if (f.per_device_train_batch_size < 1 || f.per_device_eval_batch_size < 1 || f.seq_len < 2 ||
      (f.max_length && *f.max_length < 2) || f.logging_steps < 1 || f.warmup_steps < 0 ||
      f.eval_steps < 0 || f.save_steps < 0 ||
      (f.gradient_accumulation_steps && *f.gradient_accumulation_steps < 1) ||
      (f.save_total_limit && *f.save_total_limit < 1)) {
    throw InvalidArgument(
        "need --per_device_train_batch_size, --per_device_eval_batch_size, --logging_steps, "
        "--gradient_accumulation_steps and --save_total_limit >= 1, --seq_len and --max_length >= "
        "2, "
        "and --warmup_steps, --eval_steps, --save_steps >= 0");
  }
  if (f.lr_scheduler_type != "linear" && f.lr_scheduler_type != "cosine" &&
      f.lr_scheduler_type != "constant" && f.lr_scheduler_type != "constant_with_warmup") {
    throw InvalidArgument("--lr_scheduler_type '" + f.lr_scheduler_type +
                          "' is not linear, cosine, constant or constant_with_warmup");
  }
  if (!(f.eval_fraction > 0 && f.eval_fraction < 1)) {
    throw InvalidArgument("--eval_fraction must be between 0 and 1 (exclusive)");
  }
  if (!f.evaluateOnly() && f.output_dir.empty()) {
    throw InvalidArgument(
        "--output_dir is needed to train (or give --max_steps 0 to only evaluate)");
  }
  if (f.evaluateOnly() && !f.output_dir.empty()) {
    throw InvalidArgument("--max_steps 0 only evaluates and writes nothing: drop --output_dir");
  }
  if (f.evaluateOnly() && !f.resume_from_checkpoint.empty()) {
    throw InvalidArgument(
        "--max_steps 0 only evaluates --model_dir: drop --resume_from_checkpoint (a checkpoint "
        "becomes a model folder with `cxxlaunch merge-weights`)");
  }
  if (f.lora_r < 0) throw InvalidArgument("--lora_r must be 0 (no LoRA) or more");
  if (!f.adapter.empty() && lora_r->count() > 0 && f.lora_r == 0) {
    throw InvalidArgument(
        "--adapter trains or evaluates a LoRA adapter and --lora_r 0 asks for a full fine-tune "
        "and its export: drop one of them");
  }
  if (!f.adapter.empty() && (lora_r->count() > 0 || lora_settings)) {
    throw InvalidArgument(
        "--adapter's adapter_config.json sets r, lora_alpha, lora_dropout, target_modules and "
        "use_rslora: drop the --lora_* and --use_rslora flags");
  }
  if (f.adapter.empty() && f.lora_r == 0 && lora_settings) {
    throw InvalidArgument(
        "--lora_alpha, --lora_dropout, --lora_target_modules and --use_rslora need --lora_r > 0 "
        "(LoRA's rank)");
  }
  return f;
}

runtime::AcceleratorOptions acceleratorOptions(const Flags& f, const runtime::WorkerEnv& env) {
  runtime::AcceleratorOptions options;
  // The launcher passes its defaults (1, 0) when the YAML is silent: only another value is the
  // launch's own.
  const bool launch_accumulates = env.gradient_accumulation_steps != 1;
  const bool launch_clips = env.gradient_clipping != 0;
  if (f.gradient_accumulation_steps) {
    if (launch_accumulates && env.gradient_accumulation_steps != *f.gradient_accumulation_steps) {
      throw InvalidArgument(
          "--gradient_accumulation_steps " + std::to_string(*f.gradient_accumulation_steps) +
          " disagrees with the launch's gradient_accumulation_steps " +
          std::to_string(env.gradient_accumulation_steps) +
          " (the config's deepspeed_config.gradient_accumulation_steps or the launcher's flag): "
          "give one of them, or the same value in both");
    }
    options.gradient_accumulation_steps = static_cast<int>(*f.gradient_accumulation_steps);
  } else {
    options.gradient_accumulation_steps = env.gradient_accumulation_steps;
  }
  if (f.max_grad_norm) {
    if (launch_clips && env.gradient_clipping != *f.max_grad_norm) {
      throw InvalidArgument("--max_grad_norm " + text(*f.max_grad_norm) +
                            " disagrees with the launch's gradient_clipping " +
                            text(env.gradient_clipping) +
                            " (the config's deepspeed_config.gradient_clipping or the launcher's "
                            "flag): give one of them, or the same value in both");
    }
    options.gradient_clipping = *f.max_grad_norm;
  } else {
    options.gradient_clipping = launch_clips ? env.gradient_clipping : kDefaultMaxGradNorm;
  }
  if (!f.evaluateOnly()) {
    options.checkpoint_dir = env.checkpoint_dir.empty() ? f.output_dir : env.checkpoint_dir;
    options.checkpoint_prefix = "checkpoint-";
    if (f.save_total_limit) options.checkpoint_total_limit = *f.save_total_limit;
  } else {
    options.checkpoint_dir = "";  // evaluation saves nothing, and resumes nothing
  }
  return options;
}

}  // namespace cxxlaunch::finetune
