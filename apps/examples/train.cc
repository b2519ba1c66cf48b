// train: a real small model trained data-parallel with the cxxlaunch runtime. The same binary
// runs as one process or under `cxxlaunch run --nproc_per_node=N`; nothing in it changes.
//
//   cxxlaunch run --nproc_per_node=2 build/bin/train --model gpt --steps 50
//
// Models: `mlp` (regression of a fixed random teacher network) and `gpt` (a small decoder-only
// transformer language model on a synthetic language whose next token is predictable from the
// previous ones, so the loss visibly falls). Rank 0 prints a progress line every --print_every
// optimizer steps and a summary with the mean step time at the end.

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "apps/examples/step_scalars.h"
#include "common/command_line.h"
#include "common/error.h"
#include "runtime/accelerator.h"
#include "runtime/fused_adamw.h"

using namespace cxxlaunch;
using namespace cxxlaunch::runtime;

namespace {

struct Flags {
  std::string model = "gpt";
  int64_t steps = 30;
  int64_t batch_size = 8;  // per process, per micro-step
  double lr = 3e-3;
  std::string optimizer = "adamw";
  std::string schedule = "cosine";
  int64_t warmup = 3;
  int64_t seq_len = 32;
  int64_t vocab = 64;
  int64_t d_model = 64;
  int64_t layers = 2;
  int64_t heads = 4;
  int64_t hidden = 256;  // mlp width
  int64_t print_every = 5;
  uint64_t seed = 1234;
  std::string dump_params;     // rank 0 writes the final parameters here (float32, by name)
  std::string checkpoint_dir;  // overrides the launcher's --checkpoint_dir
  int64_t save_every = 0;      // optimizer steps between checkpoints; 0: none
  int64_t crash_at_step = 0;   // demos and tests: the last rank exits 3 there, first attempt only
  bool load_again = false;     // after training, load the newest checkpoint once more (timed)
  std::string run_name = "train";  // the trackers' run folder (with the launcher's --log_with)
};

Flags parse(int argc, char** argv) {
  Flags f;
  CLI::App app(
      "An example trainer: a small GPT (or MLP) on synthetic data, through the Accelerator.",
      "train");
  cli::useConventions(app);
  auto add = [&](const char* name, auto& value, const char* help) {
    app.add_option(cli::spellings(name), value, help)->capture_default_str();
  };
  add("model", f.model, "gpt or mlp");
  add("steps", f.steps, "optimizer steps");
  add("batch_size", f.batch_size, "examples per process per micro-step");
  add("lr", f.lr, "learning rate");
  add("optimizer", f.optimizer, "adamw, torch_adamw or sgd");
  add("schedule", f.schedule, "constant, linear or cosine");
  add("warmup", f.warmup, "warm-up steps of the schedule");
  add("seq_len", f.seq_len, "tokens per example");
  add("vocab", f.vocab, "vocabulary size");
  add("d_model", f.d_model, "model width");
  add("layers", f.layers, "transformer blocks");
  add("heads", f.heads, "attention heads");
  add("hidden", f.hidden, "MLP width");
  add("print_every", f.print_every, "steps between loss lines");
  add("seed", f.seed, "random seed");
  add("dump_params", f.dump_params, "rank 0 writes the final parameters here (float32, by name)");
  add("checkpoint_dir", f.checkpoint_dir, "overrides the launcher's --checkpoint_dir");
  add("save_every", f.save_every, "optimizer steps between checkpoints; 0: none");
  add("crash_at_step", f.crash_at_step,
      "demos and tests: the last rank exits 3 there, first attempt only");
  app.add_flag(cli::spellings("load_again"), f.load_again,
               "after training, load the newest checkpoint once more, into the memory the job "
               "already has (a roll-back; bench/checkpoint_io.py times it)");
  add("run_name", f.run_name, "the trackers' run folder under --project_dir (with --log_with)");
  cli::parseOrExit(app, argc, argv);
  if (f.model != "gpt" && f.model != "mlp") throw InvalidArgument("--model must be gpt or mlp");
  if (f.optimizer != "adamw" && f.optimizer != "torch_adamw" && f.optimizer != "sgd") {
    throw InvalidArgument("--optimizer must be adamw, torch_adamw or sgd");
  }
  if (f.steps < 1 || f.batch_size < 1 || f.d_model % f.heads != 0 || f.warmup > f.steps) {
    throw InvalidArgument(
        "need --steps >= 1, --batch_size >= 1, --warmup <= --steps and "
        "--d_model divisible by --heads");
  }
  return f;
}

// "1.23 GB in 0.51 s, 2.41 GB/s": the bytes of a checkpoint directory over the time since `start`.
std::string ioRate(const std::string& dir, std::chrono::steady_clock::time_point start) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double bytes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_regular_file()) bytes += static_cast<double>(entry.file_size());
  }
  char text[96];
  std::snprintf(text, sizeof(text), "%.3f GB in %.3f s, %.2f GB/s", bytes / 1e9, seconds,
                bytes / 1e9 / seconds);
  return text;
}

// ---- the models -------------------------------------------------------------------------------

// LibTorch 1.13's LinearImpl::forward runs a 3-D input as matmul plus an in-place bias add (two
// kernels and a slower backward); torch::linear folds it into one addmm, as Python's nn.Linear
// does.
torch::Tensor linear(const torch::nn::Linear& layer, const torch::Tensor& x) {
  return torch::linear(x, layer->weight, layer->bias);
}

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t in, int64_t hidden, int64_t out)
      : fc1(register_module("fc1", torch::nn::Linear(in, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        fc3(register_module("fc3", torch::nn::Linear(hidden, out))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3(torch::gelu(fc2(torch::gelu(fc1(x)))));
  }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t d, int64_t heads)
      : heads_(heads),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        qkv(register_module("qkv", torch::nn::Linear(d, 3 * d))),
        proj(register_module("proj", torch::nn::Linear(d, d))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        up(register_module("up", torch::nn::Linear(d, 4 * d))),
        down(register_module("down", torch::nn::Linear(4 * d, d))) {}

  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& causal) {
    const auto b = x.size(0), t = x.size(1), d = x.size(2), hd = d / heads_;
    auto q_k_v = linear(qkv, ln1(x)).view({b, t, 3, heads_, hd}).permute({2, 0, 3, 1, 4});
    auto q = q_k_v[0], k = q_k_v[1], v = q_k_v[2];
    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    scores = scores.masked_fill(causal, -std::numeric_limits<float>::infinity());
    auto attended = torch::matmul(torch::softmax(scores, -1), v);
    auto h = x + linear(proj, attended.permute({0, 2, 1, 3}).reshape({b, t, d}));
    return h + linear(down, torch::gelu(linear(up, ln2(h))));
  }

  int64_t heads_;
  torch::nn::LayerNorm ln1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear up, down;
};
TORCH_MODULE(Block);

struct GptImpl : torch::nn::Module {
  GptImpl(int64_t vocab, int64_t seq_len, int64_t d, int64_t layers, int64_t heads)
      : tokens(register_module("tokens", torch::nn::Embedding(vocab, d))),
        positions(register_module("positions", torch::nn::Embedding(seq_len, d))),
        ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        head(register_module("head", torch::nn::Linear(d, vocab))) {
    for (int64_t i = 0; i < layers; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i), Block(d, heads)));
    }
  }

  torch::Tensor forward(const torch::Tensor& idx) {
    const auto t = idx.size(1);
    auto causal = torch::ones({t, t}, idx.options().dtype(torch::kBool)).triu(1);
    auto x = tokens(idx) + positions(torch::arange(t, idx.options().dtype(torch::kLong)));
    // Through unitForward: under ZeRO-3 / FULL_SHARD each block's parameters are gathered just
    // in time; under every other strategy it is block->forward(x, causal).
    for (auto& block : blocks) x = unitForward(block, x, causal);
    return linear(head, ln(x));
  }

  torch::nn::Embedding tokens, positions;
  std::vector<Block> blocks;
  torch::nn::LayerNorm ln;
  torch::nn::Linear head;
};
TORCH_MODULE(Gpt);

// ---- synthetic data ---------------------------------------------------------------------------

// Sequences of a toy language: x[t+1] = (x[t] + x[t-1]) mod vocab from two random seeds, so the
// next token is a function of the previous two: a transformer learns it quickly.
struct Language : torch::data::datasets::Dataset<Language> {
  Language(int64_t examples, int64_t seq_len, int64_t vocab, uint64_t seed) {
    auto gen = at::detail::createCPUGenerator(seed);
    data = torch::empty({examples, seq_len + 1}, torch::kLong);
    auto starts = torch::randint(vocab, {examples, 2}, gen, torch::kLong);
    auto acc = data.accessor<int64_t, 2>();
    auto s = starts.accessor<int64_t, 2>();
    for (int64_t e = 0; e < examples; ++e) {
      acc[e][0] = s[e][0];
      acc[e][1] = s[e][1];
      for (int64_t t = 2; t <= seq_len; ++t) acc[e][t] = (acc[e][t - 1] + acc[e][t - 2]) % vocab;
    }
  }
  torch::data::Example<> get(size_t i) override {
    auto row = data[static_cast<int64_t>(i)];
    return {row.slice(0, 0, -1), row.slice(0, 1)};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(data.size(0)); }
  torch::Tensor data;
};

// y = teacher(x) for a fixed random teacher network.
struct Regression : torch::data::datasets::Dataset<Regression> {
  Regression(int64_t examples, int64_t in, int64_t out, uint64_t seed) {
    auto gen = at::detail::createCPUGenerator(seed);
    inputs = torch::randn({examples, in}, gen);
    auto w = torch::randn({in, out}, gen) / std::sqrt(static_cast<double>(in));
    targets = torch::tanh(inputs.matmul(w));
  }
  torch::data::Example<> get(size_t i) override {
    return {inputs[static_cast<int64_t>(i)], targets[static_cast<int64_t>(i)]};
  }
  torch::optional<size_t> size() const override { return static_cast<size_t>(inputs.size(0)); }
  torch::Tensor inputs, targets;
};

// The whole parameters (gathered from the shards where they are sharded), in name order, as raw
// float32: what the parity tests compare across strategies.
void dumpParameters(Accelerator& acc, const std::string& path) {
  auto params = acc.fullParameters();  // a collective: every rank takes part
  if (!acc.isMainProcess()) return;
  std::sort(params.begin(), params.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::ofstream out(path, std::ios::binary);
  for (const auto& [name, tensor] : params) {
    auto t = tensor.to(torch::kFloat).contiguous();
    out.write(static_cast<const char*>(t.data_ptr()),
              static_cast<std::streamsize>(t.numel() * t.element_size()));
  }
  if (!out.flush()) throw std::runtime_error("cannot write " + path);
}

template <typename Dataset, typename Model, typename LossFn>
int train(const Flags& f, Accelerator& acc, Dataset dataset, Model model, LossFn loss_fn,
          int64_t tokens_per_example) {
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (f.optimizer == "adamw") {
    optimizer = std::make_unique<FusedAdamW>(model->parameters(),
                                             torch::optim::AdamWOptions(f.lr).weight_decay(0.01));
  } else if (f.optimizer == "torch_adamw") {
    optimizer = std::make_unique<torch::optim::AdamW>(
        model->parameters(), torch::optim::AdamWOptions(f.lr).weight_decay(0.01));
  } else {
    optimizer = std::make_unique<torch::optim::SGD>(model->parameters(),
                                                    torch::optim::SGDOptions(f.lr).momentum(0.9));
  }
  LrScheduler schedule(*optimizer, LrScheduler::parse(f.schedule), f.warmup, f.steps);
  // The transformer blocks are the shard units (a no-op unless parameters are sharded at rest).
  if constexpr (requires { model->blocks; }) {
    for (auto& block : model->blocks) acc.wrap(*block);
  }
  int64_t numel = 0;  // counted before prepare: strategies shard and re-type the parameters
  for (const auto& p : model->parameters()) numel += p.numel();
  acc.prepare(model.ptr(), *optimizer, &schedule);
  auto loader = acc.prepareDataLoader(std::move(dataset), static_cast<size_t>(f.batch_size));
  acc.initTrackers(f.run_name,
                   {{"model", f.model},
                    {"parameters", numel},
                    {"steps", f.steps},
                    {"batch_size", f.batch_size},
                    {"lr", f.lr},
                    {"optimizer", f.optimizer},
                    {"schedule", f.schedule},
                    {"warmup", f.warmup},
                    {"seq_len", f.seq_len},
                    {"seed", f.seed},
                    {"global batch", acc.describeBatch(static_cast<size_t>(f.batch_size))},
                    {"strategy (resolved)", acc.describeStrategy()}});
  acc.print("training ", f.model, " (", numel, " parameters) on ", acc.worldSize(),
            " process(es), ", acc.describeBatch(static_cast<size_t>(f.batch_size)), "; ",
            acc.describeStrategy());
  // The resume is timed from when every rank is ready (as the peer's load is, from a barrier):
  // the time is the load's, not that of the slowest rank's set-up.
  if (!acc.checkpointDir().empty()) acc.waitForEveryone();
  // A restarted (or re-formed) job goes on from the newest complete checkpoint; the loader then
  // skips the batches the saved run had already trained on.
  const auto resume_start = std::chrono::steady_clock::now();
  if (auto from = acc.resume()) {
    acc.print("resumed from ", *from, " at step ", acc.optimizerSteps(), " (",
              ioRate(*from, resume_start), ")");
  }

  // Every save once committed: at once when synchronous; with --checkpoint_async at the step,
  // save or end that committed it, the time training was blocked being what it waited.
  auto printSaves = [&] {
    for (const auto& s : acc.takeSaveReports()) {
      char text[96];
      std::snprintf(text, sizeof(text), "%.3f GB in %.3f s, training blocked %.3f s",
                    static_cast<double>(s.bytes) / 1e9, s.seconds, s.blocked_seconds);
      acc.print("saved ", s.dir, " (", text, ")");
    }
  };

  // The mean step time leaves out the first two steps (allocations, first buckets).
  constexpr int64_t kUntimedSteps = 2;
  auto timed_from = std::chrono::steady_clock::now();
  auto last = timed_from;
  // Each optimizer step's time (from the end of the one before, its save left out), apart for
  // the steps that began while a checkpoint was being written in the background.
  auto step_began = timed_from;
  bool began_during_save = false;
  double step_seconds[2] = {0, 0};  // [without a save being written, with one]
  int64_t steps_timed[2] = {0, 0};
  int64_t examples_since = 0;
  double loss_sum = 0;
  int64_t loss_count = 0;
  auto step_start = timed_from;  // this optimizer step's, for the trackers
  int64_t step_examples = 0, step_losses = 0;
  double step_loss_sum = 0;
  while (acc.optimizerSteps() < f.steps) {
    for (auto& batch : *loader) {
      auto data = torch::stack(std::vector<torch::Tensor>([&] {
        std::vector<torch::Tensor> v;
        for (auto& e : batch) v.push_back(e.data);
        return v;
      }()));
      std::vector<torch::Tensor> ys;
      for (auto& e : batch) ys.push_back(e.target);
      auto target = torch::stack(ys).to(acc.device());
      data = data.to(acc.device());
      auto loss = loss_fn(model->forward(data), target);
      const double loss_value = loss.template item<double>();
      loss_sum += loss_value;
      ++loss_count;
      examples_since += data.size(0);
      step_loss_sum += loss_value;
      ++step_losses;
      step_examples += data.size(0);
      const double lr_used = optimizer->param_groups()[0].options().get_lr();
      acc.backward(loss);
      if (!acc.step()) continue;
      const int64_t step = acc.optimizerSteps();
      if (!acc.trackerNames().empty()) {
        const auto now = std::chrono::steady_clock::now();
        const double step_s = std::chrono::duration<double>(now - step_start).count();
        acc.log(
            examples::stepScalars(
                step_loss_sum / static_cast<double>(step_losses), lr_used,
                static_cast<double>(step_examples * tokens_per_example * acc.worldSize()) / step_s,
                step_s, acc.memoryReport()),
            step);
        step_start = now;
      }
      acc.setProgressLoss(step_loss_sum / static_cast<double>(step_losses));
      step_examples = step_losses = 0;
      step_loss_sum = 0;
      if (step > kUntimedSteps) {
        step_seconds[began_during_save] +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - step_began).count();
        ++steps_timed[began_during_save];
      }
      printSaves();
      if (step == kUntimedSteps) timed_from = std::chrono::steady_clock::now();
      if (step % f.print_every == 0 || step == f.steps) {
        const auto now = std::chrono::steady_clock::now();
        const double seconds = std::chrono::duration<double>(now - last).count();
        const double tokens_per_s =
            static_cast<double>(examples_since * tokens_per_example * acc.worldSize()) / seconds;
        char line[256];
        std::snprintf(line, sizeof(line),
                      "step %4lld/%lld  loss %.4f  lr %.2e  %.0f tokens/s  (%s)",
                      static_cast<long long>(step), static_cast<long long>(f.steps),
                      loss_sum / static_cast<double>(loss_count),
                      optimizer->param_groups()[0].options().get_lr(), tokens_per_s,
                      acc.describeBatch(static_cast<size_t>(f.batch_size)).c_str());
        acc.print(line);
        last = now;
        examples_since = 0;
        loss_sum = 0;
        loss_count = 0;
      }
      if (f.save_every > 0 && step % f.save_every == 0) {
        acc.saveCheckpoint();
        printSaves();
      }
      if (step == f.crash_at_step && acc.rank() == acc.worldSize() - 1 &&
          acc.env().restart_count == 0) {
        std::cerr << "train: --crash_at_step " << step << ": exiting as a crash would\n";
        std::_Exit(3);
      }
      step_began = std::chrono::steady_clock::now();
      began_during_save = acc.checkpointInFlight();
      if (step >= f.steps) break;
    }
  }
  acc.waitForCheckpoint();
  printSaves();
  if (steps_timed[1] > 0) {
    auto mean = [&](int i) { return step_seconds[i] / static_cast<double>(steps_timed[i]) * 1e3; };
    char line[160];
    std::snprintf(line, sizeof(line),
                  "step time while a checkpoint was written: %.2f ms (%lld steps); without: "
                  "%.2f ms (%lld steps)",
                  mean(1), static_cast<long long>(steps_timed[1]),
                  steps_timed[0] > 0 ? mean(0) : 0.0, static_cast<long long>(steps_timed[0]));
    acc.print(line);
  }
  const double timed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - timed_from).count();
  if (f.load_again) {
    const auto load_start = std::chrono::steady_clock::now();
    if (auto from = acc.resume()) {
      acc.print("loaded again ", *from, " (", ioRate(*from, load_start), ")");
    } else {
      acc.print("--load_again: no complete checkpoint in ", acc.checkpointDir(),
                " to load (save one with --save_every)");
    }
  }
  const int64_t timed_steps = f.steps > kUntimedSteps ? f.steps - kUntimedSteps : f.steps;
  acc.print("done: ", f.steps, " steps, mean step time ",
            static_cast<long long>(timed / static_cast<double>(timed_steps) * 1e6) / 1000.0,
            " ms; ", acc.memoryReport().str());
  if (!f.dump_params.empty()) dumpParameters(acc, f.dump_params);
  acc.endTraining();
  if (!acc.reportPath().empty()) acc.print("report: ", acc.reportPath());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Flags f = parse(argc, argv);
    torch::set_num_threads(1);  // one core per worker: the launcher starts one worker per slot
    AcceleratorOptions options;
    if (!f.checkpoint_dir.empty()) options.checkpoint_dir = f.checkpoint_dir;
    Accelerator acc(options);
    if (f.load_again && acc.checkpointDir().empty()) {
      throw InvalidArgument(
          "--load_again loads from the checkpoint folder: give one with --checkpoint_dir (the "
          "trainer's or the launcher's)");
    }
    torch::manual_seed(f.seed);  // the same initial weights everywhere (DDP broadcasts anyway)
    const int64_t examples = f.batch_size * acc.worldSize() * acc.gradientAccumulationSteps() * 64;
    if (f.model == "mlp") {
      const int64_t in = 32, out = 8;
      return train(
          f, acc, Regression(examples, in, out, f.seed), Mlp(in, f.hidden, out),
          [](const torch::Tensor& y, const torch::Tensor& t) { return torch::mse_loss(y, t); }, 1);
    }
    return train(
        f, acc, Language(examples, f.seq_len, f.vocab, f.seed),
        Gpt(f.vocab, f.seq_len, f.d_model, f.layers, f.heads),
        [vocab = f.vocab](const torch::Tensor& logits, const torch::Tensor& t) {
          return torch::cross_entropy_loss(logits.reshape({-1, vocab}), t.reshape({-1}));
        },
        f.seq_len);
  } catch (const InvalidArgument& e) {
    std::cerr << "train: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "train: " << e.what() << "\n";
    return 1;
  }
}
