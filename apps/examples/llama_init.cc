// llama_init: writes a randomly initialised Hugging Face-layout Llama / Qwen2 / Mistral folder
// (config.json + model.safetensors, or shards + model.safetensors.index.json), the fixture the
// finetune tests and benchmarks start from: no pretrained weights can be downloaded on the
// machines this project is built and tested on. The weights are HF's initialisation
// (normal(0, 0.02), norms at 1), so the folder loads into transformers as well as into finetune.
//
//   llama_init --output_dir /tmp/tiny --hidden_size 64 --intermediate_size 128
//       --num_hidden_layers 2 --num_attention_heads 4 --num_key_value_heads 2 --vocab_size 300
//       [--model_type llama|qwen2|mistral] [--tie_word_embeddings]
//       [--dtype f32|bf16|f16] [--max_file_bytes N] [--seed S]
//   llama_init --output_dir /tmp/copy --config /path/to/config.json --dtype bf16
//
// One process, no launcher needed (a plain Accelerator is a world of one). The same --seed gives
// the same weights. The folder is written as OUT.partial and renamed to OUT at the end; a failure
// (a full disk) removes OUT.partial. Exit codes: 0 written; 2 a usage mistake (bad flags, an
// inconsistent or unreadable config, a model larger than the machine's memory, an output folder
// that is not absent or empty, or is a symbolic link), nothing written; 1 anything else (a full
// disk), nothing left behind.

#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>

#include "apps/examples/output_dir.h"
#include "common/command_line.h"
#include "common/env_names.h"
#include "common/error.h"
#include "models/llama.h"
#include "runtime/accelerator.h"
#include "runtime/error_report.h"

using namespace cxxlaunch;
using namespace cxxlaunch::runtime;
using cxxlaunch::models::LlamaConfig;
using cxxlaunch::models::LlamaForCausalLM;

namespace {

struct Flags {
  std::string output_dir;
  std::string config;  // an HF config.json; otherwise the architecture flags below
  LlamaConfig arch;
  std::string dtype = "f32";
  uint64_t max_file_bytes = 5'000'000'000ull;  // HF's default shard size
  uint64_t seed = 1234;
};

Flags parse(int argc, char** argv) {
  Flags f;
  CLI::App app("Writes a randomly initialised Hugging Face-layout Llama/Qwen2/Mistral folder.",
               "llama_init");
  cli::useConventions(app);
  auto add = [&](const char* name, auto& value, const char* help) {
    return app.add_option(cli::spellings(name), value, help)->capture_default_str();
  };
  add("output_dir", f.output_dir, "the folder to write (absent or empty)")->required();
  add("config", f.config, "an HF config.json to copy the architecture from");
  add("model_type", f.arch.model_type, "llama, qwen2 or mistral");
  add("hidden_size", f.arch.hidden_size, "model width");
  add("intermediate_size", f.arch.intermediate_size, "MLP width");
  add("num_hidden_layers", f.arch.num_hidden_layers, "decoder layers");
  add("num_attention_heads", f.arch.num_attention_heads, "query heads");
  add("num_key_value_heads", f.arch.num_key_value_heads, "key/value heads (default: query heads)");
  add("vocab_size", f.arch.vocab_size, "vocabulary size");
  add("max_position_embeddings", f.arch.max_position_embeddings, "longest sequence");
  app.add_flag(cli::spellings("tie_word_embeddings"), f.arch.tie_word_embeddings,
               "lm_head shares the embedding's weight");
  add("dtype", f.dtype, "f32, bf16 or f16: the weights' type on disk");
  add("max_file_bytes", f.max_file_bytes, "largest safetensors file; more weights: shards");
  add("seed", f.seed, "random seed of the initialisation");
  cli::parseOrExit(app, argc, argv);
  // Before any work: OUT/ and OUT name one folder; a file, a link or a full folder is refused.
  f.output_dir = examples::checkOutputDir(f.output_dir, "--output_dir");
  return f;
}

// The model is built whole, in fp32, in this process: refused before anything is allocated
// when that is more than the machine's memory (a num_hidden_layers or vocab_size typed with
// extra zeros would otherwise allocate, or grow module by module, until killed).
void requireMemoryFor(const LlamaConfig& config) {
  const double bytes = config.parameterCount() * 4;
  const double memory = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
                        static_cast<double>(::sysconf(_SC_PAGE_SIZE));
  if (memory > 0 && !(bytes <= memory)) {
    char line[200];
    std::snprintf(line, sizeof(line),
                  "%.4g parameters, %.4g GiB in fp32, more than this machine's %.4g GiB of memory",
                  config.parameterCount(), bytes / (1 << 30), memory / (1 << 30));
    throw InvalidArgument(std::string("the architecture has ") + line +
                          ": check vocab_size, hidden_size, intermediate_size and "
                          "num_hidden_layers");
  }
}

c10::ScalarType dtypeOf(const std::string& name) {
  if (name == "f32") return torch::kFloat;
  if (name == "bf16") return torch::kBFloat16;
  if (name == "f16") return torch::kHalf;
  throw InvalidArgument("--dtype '" + name + "' is not one of f32, bf16, f16");
}

// The architecture: a config.json given, else the flags, checked by the same parser a model
// folder's config.json goes through (heads that divide the width, keys all there).
LlamaConfig configOf(const Flags& f) {
  if (!f.config.empty()) return LlamaConfig::fromFile(f.config);
  LlamaConfig arch = f.arch;
  if (arch.num_key_value_heads == 0) arch.num_key_value_heads = arch.num_attention_heads;
  if (arch.hidden_size <= 0 || arch.intermediate_size <= 0 || arch.num_hidden_layers <= 0 ||
      arch.num_attention_heads <= 0 || arch.vocab_size <= 0) {
    throw InvalidArgument(
        "give --config FILE, or all of --hidden_size, --intermediate_size, --num_hidden_layers, "
        "--num_attention_heads and --vocab_size (positive)");
  }
  return LlamaConfig::fromJson(arch.toJson(), "the architecture flags");
}

int writeModel(const Flags& f) {
  const LlamaConfig config = configOf(f);
  const c10::ScalarType dtype = dtypeOf(f.dtype);
  requireMemoryFor(config);
  torch::set_num_threads(1);
  Accelerator acc;
  if (acc.worldSize() != 1) {
    throw InvalidArgument("llama_init is one process; run it without cxxlaunch run");
  }
  torch::manual_seed(f.seed);
  LlamaForCausalLM model(config);
  int64_t numel = 0;
  for (const auto& p : model->parameters()) numel += p.numel();
  // prepare wants an optimizer to drive; none ever steps here (saveModel needs a prepared model).
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.0));
  acc.prepare(model.ptr(), optimizer);
  // Under OUT.partial, renamed at the end: a kill or a full disk never
  // leaves an OUT that looks written, and a failure removes what was written.
  examples::PartialDir partial(f.output_dir, /*owner=*/true);
  acc.saveModel(partial.path(), f.max_file_bytes, dtype);
  acc.save(partial.path() + "/config.json", config.toJson());
  if (const std::string error = partial.commit(); !error.empty()) {
    throw std::runtime_error(error);
  }
  acc.print("wrote ", f.output_dir, ": ", config.model_type, " with ", numel, " parameters in ",
            c10::toString(dtype));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // An error this main does not catch becomes one `error:` line and exit code 2 (InvalidArgument)
  // or 1 (runtime/error_report.h), also for what is thrown before the Accelerator exists.
  const char* error_file = std::getenv(env::kErrorFile);  // NOLINT(concurrency-mt-unsafe)
  installUncaughtErrorReport(error_file != nullptr ? error_file : "");
  try {
    return writeModel(parse(argc, argv));
  } catch (...) {
    // An exception nobody catches unwinds nothing: caught and rethrown here, the destructors on
    // the way run first (OUT.partial is removed), then the error report takes it.
    throw;
  }
}
