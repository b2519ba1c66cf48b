// finetune: fine-tunes a Hugging Face-layout Llama / Qwen2 / Mistral folder on a text file and
// writes the result as an HF folder again. The same binary runs as one process or under
// `cxxlaunch run` with any accelerate YAML (DDP, DeepSpeed ZeRO-1/2/3, FSDP); the strategy, the
// mixed precision and the 16-bit export are the config's.
//
//   cxxlaunch run --config_file deepspeed_zero3.yaml build/bin/finetune
//       --model_dir MODEL --data train.txt --steps 200 --seq_len 512 --batch_size 4 --lr 2e-5
//       --output_dir OUT [--eval_fraction 0.1] [--seed 1234] [--print_every 10]
//   build/bin/finetune --model_dir OUT --data train.txt --seq_len 512 --steps 0   # load + eval
//
// Tokens: the folder's tokenizer.json through text/ when there is one, else its tokenizer.model
// through SentencePiece (either way each line of the
// file encoded on its own, newlines dropped, no BOS: as HF's run_clm example feeds lines; in the
// process finetune_tokenize, beside this binary, which says why), else
// bytes (token = byte value; the vocabulary must hold 256). Every rank tokenises the whole file.
// The tokens are cut into blocks of --seq_len; the last --eval_fraction of the blocks (at least
// one) are held out. Training: AdamW (weight decay 0, a constant --lr; clipping and accumulation
// are the config's) for --steps optimizer steps, cycling over the training blocks. Evaluation:
// the mean per-token loss over every held-out block exactly once, and its perplexity, before
// training, after it, and of the written OUT read back (what `--steps 0` on OUT reports under
// the same config: each line names its compute precision, and bf16 and fp32 differ).
// OUT: the weights (Accelerator::saveModel: fp32, or 16-bit where the config sets
// zero3_save_16bit_model), config.json and the tokenizer files of MODEL; written under
// OUT.partial and renamed at the end, so an OUT that exists is complete; a failure on the way
// removes OUT.partial. --steps 0 writes nothing. Every file read is opened as common/file.h's
// openRegularFile does (a FIFO, a directory or an oversized file is refused at once), and every
// check of the input and of OUT comes before the model is built.
//
// Exit codes: 0 done; 2 a usage or input mistake (unknown flag, a non-finite number, a folder
// without config.json, another architecture, sizes the weights do not hold, data too short,
// --seq_len too long, a checkpoint that does not match or is truncated, an OUT that is not
// absent or an empty folder, a launcher setting finetune does not honour such as
// --checkpoint_dir), one `error:` line (runtime/error_report.h), nothing written; 1 anything
// else (a full disk), nothing left behind.

#include <sys/stat.h>
#include <torch/torch.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "apps/examples/output_dir.h"
#include "apps/examples/step_scalars.h"
#include "apps/examples/tokens.h"
#include "common/command_line.h"
#include "common/env_names.h"
#include "common/error.h"
#include "common/file.h"
#include "models/chunked_loss.h"
#include "models/llama.h"
#include "runtime/accelerator.h"
#include "runtime/checkpoint/model_folder.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/env.h"
#include "runtime/error_report.h"
#include "runtime/fused_adamw.h"

using namespace cxxlaunch;
using namespace cxxlaunch::runtime;
using cxxlaunch::models::LlamaConfig;
using cxxlaunch::models::LlamaForCausalLM;
namespace fs = std::filesystem;

namespace {

struct Flags {
  std::string model_dir;
  std::string data;
  int64_t steps = 100;
  int64_t seq_len = 512;
  int64_t batch_size = 4;  // per process, per micro-step
  double lr = 2e-5;
  std::string output_dir;
  double eval_fraction = 0.1;
  uint64_t seed = 1234;
  int64_t print_every = 10;
  std::string run_name = "finetune";  // the trackers' run folder (with the launcher's --log_with)
};

Flags parse(int argc, char** argv) {
  Flags f;
  CLI::App app("Fine-tunes a Hugging Face Llama/Qwen2/Mistral folder on a text file.", "finetune");
  cli::useConventions(app);
  auto add = [&](const char* name, auto& value, const char* help) {
    return app.add_option(cli::spellings(name), value, help)->capture_default_str();
  };
  add("model_dir", f.model_dir, "the HF model folder (config.json, safetensors)")->required();
  add("data", f.data, "a text file to train and evaluate on")->required();
  add("steps", f.steps, "optimizer steps; 0: load, evaluate and exit");
  add("seq_len", f.seq_len, "tokens per block");
  add("batch_size", f.batch_size, "blocks per process per micro-step");
  add("lr", f.lr, "learning rate (constant)");
  add("output_dir", f.output_dir, "where the fine-tuned HF folder goes (absent or empty)");
  add("eval_fraction", f.eval_fraction, "the last fraction of the blocks, held out for eval");
  add("seed", f.seed, "random seed");
  add("print_every", f.print_every, "steps between loss lines");
  add("run_name", f.run_name, "the trackers' run folder under --project_dir (with --log_with)");
  cli::parseOrExit(app, argc, argv);
  if (f.steps < 0 || f.batch_size < 1 || f.seq_len < 2 || f.print_every < 1 || !(f.lr > 0) ||
      !std::isfinite(f.lr)) {
    throw InvalidArgument(
        "need --steps >= 0, --batch_size >= 1, --seq_len >= 2, --print_every >= 1, and a finite "
        "--lr > 0");
  }
  if (!(f.eval_fraction > 0 && f.eval_fraction < 1)) {
    throw InvalidArgument("--eval_fraction must be between 0 and 1 (exclusive)");
  }
  if (f.steps > 0 && f.output_dir.empty()) {
    throw InvalidArgument("--output_dir is needed to train (or give --steps 0 to only evaluate)");
  }
  if (f.steps == 0 && !f.output_dir.empty()) {
    throw InvalidArgument("--steps 0 only evaluates and writes nothing: drop --output_dir");
  }
  // Every check of the output before any work: a run must not train for hours to fail at the
  // end (OUT/ with a trailing slash, a file or a link in OUT's place, a folder not writable).
  if (f.steps > 0) f.output_dir = examples::checkOutputDir(f.output_dir, "--output_dir");
  return f;
}

// The launcher's settings this program does not honour, refused rather than silently ignored
// (docs/finetune.md lists them): finetune saves no checkpoints, so a checkpoint folder, a limit
// on their number or asynchronous saving would do nothing.
void refuseUnhonouredSettings() {
  const WorkerEnv e = readWorkerEnv();
  auto refuse = [](const std::string& setting, const std::string& value) {
    throw InvalidArgument("finetune saves no checkpoints, so " + setting + " (" + value +
                          ") would write nothing: launch without it (the fine-tuned model goes "
                          "to --output_dir)");
  };
  if (!e.checkpoint_dir.empty()) {
    refuse("the launcher's --checkpoint_dir",
           std::string(env::kCheckpointDir) + "=" + e.checkpoint_dir);
  }
  if (e.checkpoint_total_limit != 0) {
    refuse(
        "the launcher's --checkpoint_total_limit",
        std::string(env::kCheckpointTotalLimit) + "=" + std::to_string(e.checkpoint_total_limit));
  }
  if (e.checkpoint_async) {
    refuse("the launcher's --checkpoint_async", std::string(env::kCheckpointAsync) + "=true");
  }
}

// The files of the model folder that OUT gets besides the weights (checkpoint/model_folder.h),
// checked before training (a FIFO or a directory in a tokenizer file's place is refused now, not
// at the export), each at most `max_bytes`.
struct CopiedFile {
  const char* name;
  size_t max_bytes;
};
// A tokenizer file's cap, or a JSON file's.
size_t maxBytesOf(std::string_view name) {
  return name.starts_with("tokenizer.") ? examples::kMaxTokenizerBytes
                                        : LlamaConfig::kMaxConfigBytes;
}

// Whether `path` names anything, a dangling or looping link included (which then fails loudly
// when opened, rather than being skipped).
bool present(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

std::vector<CopiedFile> filesToCopy(const std::string& model_dir) {
  std::vector<CopiedFile> files;
  for (const char* name : runtime::checkpoint::kModelFolderFiles) {
    const CopiedFile file{name, maxBytesOf(name)};
    const std::string path = model_dir + "/" + file.name;
    if (!present(path)) continue;
    (void)openRegularFile(path, "the model's " + std::string(file.name), file.max_bytes);
    files.push_back(file);
  }
  return files;
}

LlamaConfig readConfig(const Flags& f) {
  struct stat st {};
  if (::stat(f.model_dir.c_str(), &st) != 0) {  // ELOOP, ENOENT, EACCES: said as they are
    throw InvalidArgument("--model_dir '" + f.model_dir + "': " + std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) {
    throw InvalidArgument("--model_dir '" + f.model_dir + "' is not a folder");
  }
  const std::string path = f.model_dir + "/config.json";
  if (!present(path)) {
    throw InvalidArgument("--model_dir '" + f.model_dir + "' has no config.json (" + path +
                          "): give a Hugging Face model folder (llama_init writes one)");
  }
  LlamaConfig config = LlamaConfig::fromFile(path);
  if (f.seq_len > config.max_position_embeddings) {
    throw InvalidArgument("--seq_len " + std::to_string(f.seq_len) +
                          " is longer than the model's max_position_embeddings " +
                          std::to_string(config.max_position_embeddings) + " (" + path + ")");
  }
  return config;
}

// Refuses a config whose sizes describe more parameters than the folder's safetensors files
// hold, before anything is allocated: a vocab_size or num_hidden_layers typed with extra zeros
// would otherwise allocate (or, built deferred, grow module by module) without bound.
void requireWeightsFor(const LlamaConfig& config, const std::string& model_dir) {
  double held = 0;
  try {
    const runtime::checkpoint::SafetensorsReader reader(model_dir);
    for (const auto& [name, entry] : reader.entries()) {
      double numel = 1;
      for (const int64_t d : entry.shape) numel *= static_cast<double>(d);
      held += numel;
    }
  } catch (const fs::filesystem_error& e) {
    throw InvalidArgument("--model_dir '" + model_dir + "': " + e.code().message());
  }
  const double wanted = config.parameterCount();
  if (wanted > held) {
    char line[160];
    std::snprintf(line, sizeof(line),
                  "describes %.4g parameters, and the safetensors files hold %.4g", wanted, held);
    throw InvalidArgument(model_dir + "/config.json " + line +
                          ": the config does not fit the weights (check vocab_size, hidden_size, "
                          "intermediate_size and num_hidden_layers)");
  }
}

// Blocks of seq_len tokens, labels = inputs (causalLmLoss shifts them).
struct Blocks : torch::data::datasets::Dataset<Blocks> {
  explicit Blocks(torch::Tensor rows) : rows(std::move(rows)) {}
  torch::data::Example<> get(size_t i) override {
    auto row = rows[static_cast<int64_t>(i)];
    return {row, row};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(rows.size(0)); }
  torch::Tensor rows;
};

// The mean per-token loss over `blocks` [n, T], the same on every rank. Rank r takes blocks r,
// r + W, r + 2W, ...: each block once, none twice (a prepared loader would pad with repeats).
// Every rank runs the same number of forward passes, since under ZeRO-3 / FULL_SHARD a forward
// is a collective: a rank whose share ran out runs block 0 and does not count it.
double evaluate(Accelerator& acc, LlamaForCausalLM& model, const torch::Tensor& blocks,
                int64_t batch_size) {
  torch::NoGradGuard no_grad;
  const int64_t n = blocks.size(0), world = acc.worldSize(), rank = acc.rank();
  const int64_t rounds = ((n + world - 1) / world + batch_size - 1) / batch_size;
  double sum = 0, count = 0;
  for (int64_t round = 0; round < rounds; ++round) {
    std::vector<torch::Tensor> rows;
    for (int64_t j = 0; j < batch_size; ++j) {
      const int64_t i = rank + world * (round * batch_size + j);
      if (i < n) rows.push_back(blocks[i]);
    }
    if (rows.empty()) {
      (void)model->forward(blocks.narrow(0, 0, 1).to(acc.device()));
      continue;
    }
    const torch::Tensor x = torch::stack(rows).to(acc.device());
    const double tokens = static_cast<double>(x.size(0) * (x.size(1) - 1));
    sum += models::causalLmLoss(model->forward(x), x).item<double>() * tokens;
    count += tokens;
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

// Writes the model and the folder's other files under OUT.partial, then renames it to OUT. A
// failure on the way (a full disk, a file replaced since the check) removes OUT.partial.
void writeOutput(Accelerator& acc, const Flags& f, const std::vector<CopiedFile>& files) {
  examples::PartialDir partial(f.output_dir, acc.isMainProcess());
  acc.saveModel(partial.path());
  // config.json verbatim (the architecture is the same; its other keys, token ids and all, stay),
  // and the tokenizer, so that OUT is a complete HF folder: the files merge-weights copies too.
  for (const CopiedFile& file : files) {
    if (!acc.isMainProcess()) continue;
    acc.save(partial.path() + "/" + file.name,
             readRegularFile(f.model_dir + "/" + file.name, "the model's " + std::string(file.name),
                             file.max_bytes));
  }
  const std::string error = partial.commit();
  // Rank 0's verdict reaches every rank (none waits for a collective rank 0 left).
  const auto failed = acc.gather(torch::tensor({error.empty() ? 0 : 1}, torch::kInt));
  if (failed[0].item<int>() != 0) {
    throw std::runtime_error(error.empty() ? "rank 0 could not write " + f.output_dir : error);
  }
}

int finetune(const Flags& f) {
  refuseUnhonouredSettings();
  const LlamaConfig config = readConfig(f);
  const std::vector<CopiedFile> copied =
      f.steps > 0 ? filesToCopy(f.model_dir) : std::vector<CopiedFile>{};
  requireWeightsFor(config, f.model_dir);
  const auto [tokens, tokenizer] = examples::tokenizeFile(f.model_dir, f.data, config.vocab_size);
  const auto total_blocks = static_cast<int64_t>(tokens.size()) / f.seq_len;
  const int64_t eval_blocks = std::max<int64_t>(
      1, static_cast<int64_t>(std::ceil(static_cast<double>(total_blocks) * f.eval_fraction)));
  const int64_t train_blocks = total_blocks - eval_blocks;
  if (train_blocks < 1) {
    throw InvalidArgument("--data '" + f.data + "' holds " + std::to_string(tokens.size()) +
                          " tokens (" + tokenizer + "): " + std::to_string(total_blocks) +
                          " block(s) of --seq_len " + std::to_string(f.seq_len) +
                          "; need at least one to train on and one to evaluate (" +
                          std::to_string(eval_blocks) + " held out by --eval_fraction)");
  }
  const torch::Tensor all = torch::tensor(tokens, torch::kLong)
                                .narrow(0, 0, total_blocks * f.seq_len)
                                .view({total_blocks, f.seq_len});
  const torch::Tensor eval_set = all.narrow(0, train_blocks, eval_blocks);

  torch::set_num_threads(1);  // one core per worker: the launcher starts one worker per slot
  Accelerator acc;
  torch::manual_seed(f.seed);
  LlamaForCausalLM model{nullptr};
  {  // zero3_init_flag / fsdp_cpu_ram_efficient_loading: no parameter memory until prepare
    auto deferred = acc.deferredInit();
    model = LlamaForCausalLM(config);
  }
  int64_t numel = 0;  // counted before prepare: strategies shard and re-type the parameters
  for (const auto& p : model->parameters()) numel += p.numel();
  FusedAdamW optimizer(model->parameters(), torch::optim::AdamWOptions(f.lr).weight_decay(0.0));
  acc.prepare(model.ptr(), optimizer);
  const auto load_start = std::chrono::steady_clock::now();
  acc.loadModel(f.model_dir);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  acc.print("loaded ", f.model_dir, " (", config.model_type, ", ", numel, " parameters) in ",
            std::round(load_s * 1000) / 1000, " s; ", acc.memoryReport().str());
  acc.print("data ", f.data, ": ", tokens.size(), " tokens (", tokenizer, "), ", total_blocks,
            " blocks of ", f.seq_len, ": ", train_blocks, " to train on, ", eval_blocks,
            " held out");
  if (f.steps > 0) {
    acc.print("fine-tuning on ", acc.worldSize(), " process(es), ",
              acc.describeBatch(static_cast<size_t>(f.batch_size)), "; ", acc.describeStrategy());
  } else {
    acc.print("evaluating on ", acc.worldSize(), " process(es); ", acc.describeStrategy());
  }
  acc.initTrackers(f.run_name, {{"model_dir", f.model_dir},
                                {"model_type", config.model_type},
                                {"parameters", numel},
                                {"data", f.data},
                                {"steps", f.steps},
                                {"seq_len", f.seq_len},
                                {"batch_size", f.batch_size},
                                {"lr", f.lr},
                                {"eval_fraction", f.eval_fraction},
                                {"seed", f.seed},
                                {"strategy (resolved)", acc.describeStrategy()}});
  const double eval_before = evaluate(acc, model, eval_set, f.batch_size);
  printEval(acc, eval_before, f.steps > 0 ? "before training" : f.model_dir);
  acc.log({{"eval/loss", eval_before}}, 0);
  if (f.steps == 0) return 0;

  auto loader = acc.prepareDataLoader(Blocks(all.narrow(0, 0, train_blocks)),
                                      static_cast<size_t>(f.batch_size));
  const auto started = std::chrono::steady_clock::now();
  auto last = started;
  int64_t examples_since = 0, loss_count = 0, window_first = 1;
  double loss_sum = 0;
  auto step_start = started;  // this optimizer step's, for the trackers
  int64_t step_examples = 0, step_losses = 0;
  double step_loss_sum = 0;
  while (acc.optimizerSteps() < f.steps) {
    for (auto& batch : *loader) {
      std::vector<torch::Tensor> rows;
      for (auto& e : batch) rows.push_back(e.data);
      const torch::Tensor x = torch::stack(rows).to(acc.device());
      // The LM head and the loss chunk by chunk: the [tokens, vocabulary] logits never exist
      // (models/chunked_loss.h). Evaluation keeps the plain path: a rank without rows runs the
      // model's forward to stay in step with the others' gathers.
      const torch::Tensor loss = models::chunkedCausalLmLoss(model, x, x);
      const double loss_value = loss.item<double>();
      loss_sum += loss_value;
      ++loss_count;
      examples_since += x.size(0);
      step_loss_sum += loss_value;
      ++step_losses;
      step_examples += x.size(0);
      acc.backward(loss);
      if (!acc.step()) continue;
      const int64_t step = acc.optimizerSteps();
      if (!acc.trackerNames().empty()) {
        const auto now = std::chrono::steady_clock::now();
        const double step_s = std::chrono::duration<double>(now - step_start).count();
        acc.log(examples::stepScalars(
                    step_loss_sum / static_cast<double>(step_losses), f.lr,
                    static_cast<double>(step_examples * f.seq_len * acc.worldSize()) / step_s,
                    step_s, acc.memoryReport()),
                step);
        step_start = now;
      }
      step_examples = step_losses = 0;
      step_loss_sum = 0;
      if (step % f.print_every == 0 || step == f.steps) {
        const auto now = std::chrono::steady_clock::now();
        const double seconds = std::chrono::duration<double>(now - last).count();
        const double tokens_per_s =
            static_cast<double>(examples_since * f.seq_len * acc.worldSize()) / seconds;
        // The loss printed is the mean over rank 0's micro-batches since the last line, which
        // says so when it spans several steps; the trackers get each step's own.
        char window[64] = "";
        if (window_first < step) {
          std::snprintf(window, sizeof(window), " (mean of steps %lld-%lld)",
                        static_cast<long long>(window_first), static_cast<long long>(step));
        }
        char line[320];
        std::snprintf(line, sizeof(line),
                      "step %4lld/%lld  loss %.4f%s  lr %.2e  %.0f tokens/s  (%s)",
                      static_cast<long long>(step), static_cast<long long>(f.steps),
                      loss_sum / static_cast<double>(loss_count), window, f.lr, tokens_per_s,
                      acc.describeBatch(static_cast<size_t>(f.batch_size)).c_str());
        acc.print(line);
        window_first = step + 1;
        last = now;
        examples_since = loss_count = 0;
        loss_sum = 0;
      }
      if (step >= f.steps) break;
    }
  }
  const double trained_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const double eval_after = evaluate(acc, model, eval_set, f.batch_size);
  printEval(acc, eval_after, "after " + std::to_string(f.steps) + " steps");
  acc.log({{"eval/loss", eval_after}}, f.steps);
  writeOutput(acc, f, copied);
  // The export read back: its figure is what `--steps 0 --model_dir OUT` reports at the same
  // mixed precision, 16-bit rounding included. Only where every rank sees OUT (nodes without a
  // shared filesystem do not).
  const bool seen = present(f.output_dir + "/config.json");
  if (acc.gather(torch::tensor({seen ? 1 : 0}, torch::kInt)).min().item<int>() == 1) {
    acc.loadModel(f.output_dir);
    printEval(acc, evaluate(acc, model, eval_set, f.batch_size), f.output_dir + " read back");
  } else {
    acc.print("not every rank sees ", f.output_dir, ": the export is not evaluated");
  }
  acc.print("done: ", f.steps, " steps in ", std::round(trained_s * 100) / 100, " s, wrote ",
            f.output_dir, "; ", acc.memoryReport().str());
  acc.endTraining();
  if (!acc.reportPath().empty()) acc.print("report: ", acc.reportPath());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // An error this main does not catch becomes one `error:` line, the launcher's error file and
  // exit code 2 (InvalidArgument) or 1 (runtime/error_report.h), also before the Accelerator.
  const char* error_file = std::getenv(env::kErrorFile);  // NOLINT(concurrency-mt-unsafe)
  installUncaughtErrorReport(error_file != nullptr ? error_file : "");
  try {
    return finetune(parse(argc, argv));
  } catch (...) {
    // An exception nobody catches unwinds nothing: caught and rethrown here, the destructors on
    // the way run first (OUT.partial is removed), then the error report takes it.
    throw;
  }
}
