#include "launcher/merge_weights.h"

#include <cstdio>
#include <ostream>

#include "common/command_line.h"
#include "launcher/agent.h"
#include "launcher/cli.h"
#include "tensorfile/merge_lora.h"
#include "tensorfile/merge_weights.h"

namespace cxxlaunch::launcher {
namespace {

using tensorfile::MergeLoraOptions;
using tensorfile::MergeWeightsOptions;

// What the command line asks for: a checkpoint merged (merge_weights.h) or, with --lora, an
// adapter merged into its base (merge_lora.h).
struct MergeCommand {
  bool lora = false;
  MergeWeightsOptions checkpoint;
  MergeLoraOptions adapter;
};

MergeCommand parseMergeWeightsArgs(const std::vector<std::string>& args) {
  CLI::App app(
      "A checkpoint (any strategy, layout and world size; or a folder of them: the newest "
      "complete one) -> the model's parameters and buffers as safetensors, the layout "
      "transformers reads. Streamed: memory stays within a few MiB of blocks.\n"
      "With --lora ADAPTER --base MODEL OUTPUT: a PEFT LoRA adapter merged into its base model "
      "folder (W + scale * B A, in the base's dtypes), written as a model folder.",
      "cxxlaunch merge-weights");
  cli::useConventions(app);
  app.footer(
      "Forms:\n"
      "  cxxlaunch merge-weights CHECKPOINT OUTPUT [--dtype D] [--max_shard_size SIZE] "
      "[--overwrite]\n"
      "  cxxlaunch merge-weights --lora ADAPTER --base MODEL OUTPUT [--max_shard_size SIZE] "
      "[--overwrite]");
  std::string checkpoint, output, dtype, max_shard_size, lora, base;
  bool overwrite = false;
  app.add_option("CHECKPOINT", checkpoint,
                 "a checkpoint directory, or a folder of them (with --lora: leave it out)");
  app.add_option("OUTPUT", output, "the folder to write (created; refused if not empty)");
  app.add_option(cli::spellings("lora"), lora)
      ->type_name("ADAPTER")
      ->description(
          "merge this LoRA adapter (PEFT's adapter_config.json and adapter_model.safetensors) "
          "into --base instead of merging a checkpoint");
  app.add_option(cli::spellings("base"), base)
      ->type_name("MODEL")
      ->description("with --lora: the adapter's base model folder (safetensors, config.json)");
  app.add_option(cli::spellings("dtype"), dtype)
      ->type_name("fp32|bf16|fp16")
      ->description(
          "the dtype written for floating-point tensors (default fp32; with --lora the base's "
          "dtypes are kept)");
  app.add_option(cli::spellings("max_shard_size"), max_shard_size)
      ->type_name("SIZE")
      ->description(
          "most tensor data per file: 5GB (default; with --lora the base's files are kept "
          "unless given), 500MB, 10GiB, or bytes");
  app.add_flag(cli::spellings("overwrite"), overwrite, "replace an OUTPUT that is not empty");
  try {
    cli::parse(app, args);
  } catch (const InvalidArgument& e) {
    throw UsageError(e.what());
  }
  uint64_t max_file_bytes = 0;
  if (!max_shard_size.empty()) {
    try {
      max_file_bytes = tensorfile::parseByteSize(max_shard_size);
    } catch (const InvalidArgument& e) {
      throw UsageError(std::string("--max_shard_size: ") + e.what());
    }
  }
  MergeCommand command;
  if (!lora.empty() || !base.empty()) {
    if (lora.empty()) throw UsageError("--base is for --lora: give --lora ADAPTER too");
    if (base.empty()) {
      throw UsageError("--lora needs the adapter's base model: --lora ADAPTER --base MODEL OUTPUT");
    }
    if (!output.empty()) {
      throw UsageError("with --lora give one folder, OUTPUT: --lora ADAPTER --base MODEL OUTPUT");
    }
    if (checkpoint.empty())
      throw UsageError("OUTPUT is missing: --lora ADAPTER --base MODEL OUTPUT");
    if (!dtype.empty()) {
      throw UsageError(
          "--dtype does not apply to --lora: the merged model keeps the base's dtypes");
    }
    command.lora = true;
    command.adapter.adapter = lora;
    command.adapter.base = base;
    command.adapter.output = checkpoint;  // the one positional argument
    command.adapter.overwrite = overwrite;
    command.adapter.max_file_bytes = max_file_bytes;
    return command;
  }
  if (checkpoint.empty() || output.empty()) {
    throw UsageError(std::string(checkpoint.empty() ? "CHECKPOINT" : "OUTPUT") +
                     " is missing: cxxlaunch merge-weights CHECKPOINT OUTPUT, or --lora ADAPTER "
                     "--base MODEL OUTPUT (see --help)");
  }
  MergeWeightsOptions& options = command.checkpoint;
  options.checkpoint = checkpoint;
  options.output = output;
  options.overwrite = overwrite;
  if (max_file_bytes > 0) options.max_file_bytes = max_file_bytes;
  if (dtype.empty() || dtype == "fp32" || dtype == "float32") {
    options.dtype = "F32";
  } else if (dtype == "bf16" || dtype == "bfloat16") {
    options.dtype = "BF16";
  } else if (dtype == "fp16" || dtype == "float16") {
    options.dtype = "F16";
  } else {
    throw UsageError("--dtype: '" + dtype + "' is not fp32, bf16 or fp16");
  }
  return command;
}

std::string sizeText(uint64_t bytes) {
  char size[32];
  const double b = static_cast<double>(bytes);
  std::snprintf(size, sizeof(size), b >= 1e9 ? "%.3f GB" : "%.3f MB", b >= 1e9 ? b / 1e9 : b / 1e6);
  return size;
}

void printNotes(const std::vector<std::string>& notes, const std::vector<std::string>& warnings,
                std::ostream& err) {
  for (const auto& note : notes) err << "cxxlaunch merge-weights: note: " << note << "\n";
  for (const auto& warning : warnings) {
    err << "cxxlaunch merge-weights: warning: " << warning << "\n";
  }
}

int runMergeLora(const MergeLoraOptions& options, std::ostream& out, std::ostream& err) {
  const auto result = tensorfile::mergeLora(options);
  printNotes(result.notes, result.warnings, err);
  out << "merged the LoRA adapter '" << options.adapter << "' (r " << result.rank << ", scale "
      << result.scale << ") into '" << options.base << "' as '" << options.output
      << "': " << result.merged << " of " << result.tensors << " tensors adapted, "
      << sizeText(result.bytes) << ":";
  for (const auto& file : result.files) out << " " << file;
  out << "\n";
  return kExitOk;
}

}  // namespace

int runMergeWeights(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const MergeCommand command = parseMergeWeightsArgs(args);
  if (command.lora) return runMergeLora(command.adapter, out, err);
  const MergeWeightsOptions& options = command.checkpoint;
  const auto result = tensorfile::mergeWeights(options);
  printNotes(result.notes, result.warnings, err);
  out << "merged '" << result.checkpoint << "' (saved at world " << result.world << ") into '"
      << options.output << "': " << result.tensors << " tensors, " << sizeText(result.bytes) << ", "
      << options.dtype << ":";
  for (const auto& file : result.files) out << " " << file;
  out << "\n";
  return kExitOk;
}

}  // namespace cxxlaunch::launcher
