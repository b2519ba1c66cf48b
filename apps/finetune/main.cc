// finetune: fine-tunes a Hugging Face-layout Llama / Qwen2 / Mistral folder on a text file or on
// JSON lines in TRL's formats (chat `messages`, `prompt`/`completion`, `text`) with HF Trainer's
// recipe, and writes the result as an HF folder again. The same binary runs as one
// process or under `cxxlaunch run` with any accelerate YAML (DDP, DeepSpeed ZeRO-1/2/3, FSDP);
// the strategy, the mixed precision and the 16-bit export are the config's.
//
//   cxxlaunch run --config_file deepspeed_zero3.yaml build/bin/finetune
//       --model_dir MODEL --data train.txt --output_dir OUT --seq_len 512
//       [--num_train_epochs 3 | --max_steps N] [--learning_rate 5e-5] [--lr_scheduler_type linear]
//       [--warmup_ratio 0.03] [--weight_decay 0.0] [--per_device_train_batch_size 8]
//       [--gradient_accumulation_steps 1] [--max_grad_norm 1.0] [--logging_steps 500]
//       [--eval_steps N] [--save_steps 500] [--save_total_limit K] [--seed 42]
//       [--resume_from_checkpoint latest|PATH]
//   build/bin/finetune --model_dir OUT --data train.txt --seq_len 512 --max_steps 0   # eval only
//   ... --lora_r 16 [--lora_alpha 32] [--lora_dropout 0.05] [--lora_target_modules all-linear]
//       [--use_rslora]                  # LoRA: a frozen base, OUT an adapter in PEFT's layout
//   build/bin/finetune --model_dir MODEL --adapter OUT --data train.txt --max_steps 0
//
// The flags are TrainingArguments' names and defaults (flags.h; docs/finetune.md has the table;
// --steps, --lr, --batch_size and --print_every are kept as aliases).
// Tokens: the folder's tokenizer.json through text/ when there is one, else its tokenizer.model
// through SentencePiece (in the process finetune_tokenize), else bytes; each line of the file on
// its own, newlines dropped, no BOS, cut into rows of --seq_len (data.h); the last
// --eval_fraction of the rows (at least one) are held out. A .jsonl: TRL's examples with the loss
// where TRL takes it (text/sft_data.h; `tokenize --labels` prints them), through the token cache,
// one a row or, with --packing, several per row of --max_length (data.h).
// Training (trainer.h): AdamW with Trainer's weight-decay groups, the LR schedule with warmup,
// clipping and accumulation from the flags or the launch's YAML (flags.h says which wins), the
// loss through the chunked LM head. Evaluation: the token-weighted loss over the held-out rows
// and its perplexity, before training, every --eval_steps, after it, and of the written OUT read
// back.
// Checkpoints: every --save_steps and at the last step, through the runtime's crash-safe saves,
// as OUT/checkpoint-<step> (or in the launcher's --checkpoint_dir), the newest
// --save_total_limit kept. The same command after a crash, or a worker group restarted under
// --max_restarts, resumes from the newest complete checkpoint (weights, optimizer, schedule,
// data position, random state) and ends bit for bit where an uninterrupted run ends; it prints
// `resumed from ...`, and each save `saved ...`.
// LoRA (lora.h): adapters on the targeted Linears, the base frozen; OUT gets
// adapter_config.json and adapter_model.safetensors as PEFT's save_pretrained writes them (no
// config.json), adapter_config.json moved in last; --adapter puts such a folder on MODEL.
// OUT: may be absent or hold this run's checkpoints; at the end the weights, config.json and
// the tokenizer files of MODEL are staged inside it and moved in with config.json last
// (output.h). An OUT holding a finished model, or anything else, is refused. --max_steps 0
// writes nothing.
//
// Exit codes: 0 done; 2 a usage or input mistake (unknown flag, a non-finite number, a folder
// without config.json, another architecture, sizes the weights do not hold, data too short, a
// .jsonl line TRL would refuse (named),
// --seq_len too long, a checkpoint that does not match or is truncated, an OUT that holds a
// finished model or files not its own, a flag that disagrees with the launch's YAML,
// --resume_from_checkpoint latest without a checkpoint, a LoRA target that matches nothing, a
// rank larger than a layer, an adapter whose base does not match), one `error:` line
// (runtime/error_report.h), nothing written; 1 anything else (a full disk), the checkpoints
// left in place and no half export.

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "apps/finetune/data.h"
#include "apps/finetune/flags.h"
#include "apps/finetune/lora.h"
#include "apps/finetune/model_folder.h"
#include "apps/finetune/output.h"
#include "apps/finetune/trainer.h"
#include "common/env_names.h"
#include "common/error.h"
#include "runtime/accelerator.h"
#include "runtime/env.h"
#include "runtime/error_report.h"
#include "runtime/fused_adamw.h"
#include "tensorfile/manifest.h"

using namespace cxxlaunch;
using namespace cxxlaunch::finetune;
using cxxlaunch::models::LlamaConfig;
using cxxlaunch::models::LlamaForCausalLM;
using cxxlaunch::runtime::Accelerator;
namespace fs = std::filesystem;

namespace {

// The checkpoint the run goes on from, loaded: --resume_from_checkpoint's, else the newest in
// the checkpoint folder if there is one.
std::optional<std::string> resume(Accelerator& acc, const Flags& f) {
  const std::string& from = f.resume_from_checkpoint;
  if (from.empty()) return acc.resume();
  if (from == "latest") {
    if (!tensorfile::holdsCheckpoints(acc.checkpointDir())) {
      throw InvalidArgument("--resume_from_checkpoint latest: there is no checkpoint in '" +
                            acc.checkpointDir() +
                            "' to resume from; drop the flag to start afresh");
    }
    return acc.resume();
  }
  std::error_code ec;
  if (!fs::exists(from, ec)) {
    throw InvalidArgument("--resume_from_checkpoint '" + from +
                          "': no such checkpoint (give a checkpoint-<step> folder, or 'latest')");
  }
  return acc.loadState(from);
}

// The export read back: its figure is what `--max_steps 0 --model_dir OUT` reports at the same
// mixed precision, 16-bit rounding included. Only where every rank sees OUT (nodes without a
// shared filesystem do not).
void readBack(Accelerator& acc, LlamaForCausalLM& model, const FinetuneData& data, const Flags& f,
              const std::string& out) {
  const bool seen = present(out + "/config.json");
  if (acc.gather(torch::tensor({seen ? 1 : 0}, torch::kInt)).min().item<int>() == 1) {
    acc.loadModel(out);
    printEval(acc, evaluate(acc, model, data.eval, f.per_device_eval_batch_size),
              out + " read back");
  } else {
    acc.print("not every rank sees ", out, ": the export is not evaluated");
  }
}

int run(const Flags& f) {
  // Every check of the input and of OUT before the model is built: a run must not train for
  // hours to fail at the end.
  const std::string out = f.evaluateOnly() ? "" : checkOutputDir(f.output_dir);
  // --seq_len cuts a text file; a .jsonl's rows are --max_length long at most (data.cc checks).
  const LlamaConfig config = readConfig(f.model_dir, isJsonLines(f.data) ? 0 : f.seq_len);
  const std::vector<CopiedFile> copied =
      f.evaluateOnly() ? std::vector<CopiedFile>{} : filesToCopy(f.model_dir);
  requireWeightsFor(config, f.model_dir);
  std::optional<LoraRun> lora = loraRunOf(f);
  const FinetuneData data = loadData({.model_dir = f.model_dir,
                                      .data = f.data,
                                      .seq_len = f.seq_len,
                                      .eval_fraction = f.eval_fraction,
                                      .vocab_size = config.vocab_size,
                                      .max_position_embeddings = config.max_position_embeddings,
                                      .max_length = f.max_length.value_or(std::min(
                                          kDefaultMaxLength, config.max_position_embeddings)),
                                      .truncation = f.truncation,
                                      .packing = f.packing,
                                      .cache_dir = f.dataset_cache_dir});
  Flags resolved = f;
  resolved.output_dir = out;
  runtime::AcceleratorOptions options = acceleratorOptions(resolved, runtime::readWorkerEnv());

  torch::set_num_threads(1);  // one core per worker: the launcher starts one worker per slot
  Accelerator acc(options);
  torch::manual_seed(f.seed);
  LlamaForCausalLM model{nullptr};
  {  // zero3_init_flag / fsdp_cpu_ram_efficient_loading: no parameter memory until prepare
    auto deferred = acc.deferredInit();
    model = LlamaForCausalLM(config);
    // The adapters' seeds are drawn after the model's: the same model on every rank.
    if (lora) addAdapters(*model, *lora);
  }
  int64_t numel = 0;  // counted before prepare: strategies shard and re-type the parameters
  for (const auto& item : model->named_parameters()) {
    if (!models::isLoraParameter(item.key())) numel += item.value().numel();
  }
  const std::string lora_line = lora ? describe(*lora, *model) : "";
  const auto adamw = torch::optim::AdamWOptions(f.learning_rate)
                         .betas({f.adam_beta1, f.adam_beta2})
                         .eps(f.adam_epsilon)
                         .weight_decay(f.weight_decay);
  runtime::FusedAdamW optimizer(decayGroups(*model, adamw), adamw);
  // The loader's batches per epoch, as prepareDataLoader cuts them: ceil(rows / world) per rank.
  const int64_t world = acc.worldSize(), rows = data.train.size();
  const int64_t batches = ((rows + world - 1) / world + f.per_device_train_batch_size - 1) /
                          f.per_device_train_batch_size;
  const Plan plan = f.evaluateOnly() ? Plan{} : planOf(f, batches, acc.gradientAccumulationSteps());
  std::optional<runtime::LrScheduler> scheduler;
  if (!f.evaluateOnly())
    scheduler.emplace(optimizer, plan.kind, plan.warmup_steps, plan.total_steps);
  acc.prepare(model.ptr(), optimizer, scheduler ? &*scheduler : nullptr);
  const auto load_start = std::chrono::steady_clock::now();
  // With LoRA the folder is the frozen base: the adapters keep their values (fresh, or
  // --adapter's), and the checkpoints name the base by path and fingerprint instead of holding
  // it (docs/runtime.md, "Frozen parameters").
  acc.loadModel(f.model_dir);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  acc.print("loaded ", f.model_dir, " (", config.model_type, ", ", numel, " parameters) in ",
            std::round(load_s * 1000) / 1000, " s; ", acc.memoryReport().str());
  if (lora) acc.print(lora_line);
  acc.print("data ", f.data, ": ", data.summary);
  if (!data.note.empty()) acc.print("note: token cache: ", data.note);
  const auto batch = static_cast<size_t>(f.per_device_train_batch_size);
  if (f.evaluateOnly()) {
    acc.print("evaluating on ", acc.worldSize(), " process(es); ", acc.describeStrategy());
  } else {
    char recipe[256];
    std::snprintf(recipe, sizeof(recipe),
                  "%lld optimizer steps (%s schedule, %lld warmup, lr %.2e, weight decay %g, "
                  "max grad norm %g)",
                  static_cast<long long>(plan.total_steps), f.lr_scheduler_type.c_str(),
                  static_cast<long long>(plan.warmup_steps), f.learning_rate, f.weight_decay,
                  *options.gradient_clipping);
    acc.print("fine-tuning on ", acc.worldSize(), " process(es), ", acc.describeBatch(batch), "; ",
              recipe, "; ", acc.describeStrategy());
  }
  runtime::RunConfig tracked = {{"model_dir", f.model_dir},
                                {"model_type", config.model_type},
                                {"parameters", numel},
                                {"data", f.data},
                                {"max_steps", plan.total_steps},
                                {"num_train_epochs", f.num_train_epochs},
                                {"seq_len", f.seq_len},
                                {"per_device_train_batch_size", f.per_device_train_batch_size},
                                {"learning_rate", f.learning_rate},
                                {"lr_scheduler_type", f.lr_scheduler_type},
                                {"warmup_steps", plan.warmup_steps},
                                {"weight_decay", f.weight_decay},
                                {"max_grad_norm", *options.gradient_clipping},
                                {"gradient_accumulation_steps", acc.gradientAccumulationSteps()},
                                {"eval_fraction", f.eval_fraction},
                                {"seed", f.seed},
                                {"strategy (resolved)", acc.describeStrategy()}};
  if (lora) {  // PEFT's LoraConfig names
    std::string targets;
    for (const auto& t : lora->config.target_modules) targets += (targets.empty() ? "" : ",") + t;
    tracked.insert(tracked.end(), {{"lora_r", lora->config.r},
                                   {"lora_alpha", lora->config.alpha},
                                   {"lora_dropout", lora->config.dropout},
                                   {"lora_target_modules", targets},
                                   {"use_rslora", lora->config.use_rslora},
                                   {"adapter", lora->adapter}});
  }
  acc.initTrackers(f.run_name, tracked);
  if (f.evaluateOnly()) {
    const double eval = evaluate(acc, model, data.eval, f.per_device_eval_batch_size);
    printEval(
        acc, eval,
        lora && !lora->adapter.empty() ? f.model_dir + " + adapter " + lora->adapter : f.model_dir);
    acc.log({{"eval/loss", eval}}, 0);
    return 0;
  }
  const auto resumed = resume(acc, f);
  if (resumed) acc.print("resumed from ", *resumed, " at step ", acc.optimizerSteps());
  const int64_t start = acc.optimizerSteps();
  const double eval_before = evaluate(acc, model, data.eval, f.per_device_eval_batch_size);
  printEval(acc, eval_before,
            resumed ? "at step " + std::to_string(start) + ", resumed" : "before training");
  acc.log({{"eval/loss", eval_before}}, start);

  const auto started = std::chrono::steady_clock::now();
  train(acc, model, *scheduler, f, plan, data, resumed.has_value());
  const double trained_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const double eval_after = evaluate(acc, model, data.eval, f.per_device_eval_batch_size);
  printEval(acc, eval_after, "after " + std::to_string(plan.total_steps) + " steps");
  acc.log({{"eval/loss", eval_after}}, plan.total_steps);
  if (lora) {
    dumpFrozenIfAsked(acc, *model);
    // An adapter is read back by `--adapter OUT --max_steps 0` (the integration tests run it):
    // loadModel reads whole models only.
    writeAdapterExport(acc, *lora, out, f.model_dir, copied);
  } else {
    writeModel(acc, out, f.model_dir, copied);
    readBack(acc, model, data, f, out);
  }
  acc.print("done: ", plan.total_steps - start, " steps in ", std::round(trained_s * 100) / 100,
            " s, wrote ", out, "; ", acc.memoryReport().str());
  acc.endTraining();
  if (!acc.reportPath().empty()) acc.print("report: ", acc.reportPath());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // An error this main does not catch becomes one `error:` line, the launcher's error file and
  // exit code 2 (InvalidArgument) or 1 (runtime/error_report.h), also before the Accelerator.
  const char* error_file = std::getenv(env::kErrorFile);  // NOLINT(concurrency-mt-unsafe)
  runtime::installUncaughtErrorReport(error_file != nullptr ? error_file : "");
  try {
    return run(parseFlags(argc, argv));
  } catch (...) {
    // An exception nobody catches unwinds nothing: caught and rethrown here, the destructors on
    // the way run first (the export's staging folder is removed), then the error report takes
    // it.
    throw;
  }
}
