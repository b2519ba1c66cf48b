#include "launcher/merge_weights.h"

#include <cstdio>
#include <ostream>

#include "common/command_line.h"
#include "launcher/agent.h"
#include "launcher/cli.h"
#include "runtime/checkpoint/merge_weights.h"

namespace cxxlaunch::launcher {
namespace {

using runtime::checkpoint::MergeWeightsOptions;

MergeWeightsOptions parseMergeWeightsArgs(const std::vector<std::string>& args) {
  CLI::App app(
      "A checkpoint (any strategy, layout and world size; or a folder of them: the newest "
      "complete one) -> the model's parameters and buffers as safetensors, the layout "
      "transformers reads. Streamed: memory stays within a few MiB of blocks.",
      "cxxlaunch merge-weights");
  cli::useConventions(app);
  std::string checkpoint, output, dtype = "fp32", max_shard_size = "5GB";
  bool overwrite = false;
  app.add_option("CHECKPOINT", checkpoint, "a checkpoint directory, or a folder of them")
      ->required();
  app.add_option("OUTPUT", output, "the folder to write (created; refused if not empty)")
      ->required();
  app.add_option(cli::spellings("dtype"), dtype)
      ->type_name("fp32|bf16|fp16")
      ->description("the dtype written for floating-point tensors (default fp32)");
  app.add_option(cli::spellings("max_shard_size"), max_shard_size)
      ->type_name("SIZE")
      ->description("most tensor data per file: 5GB (default), 500MB, 10GiB, or bytes");
  app.add_flag(cli::spellings("overwrite"), overwrite, "replace an OUTPUT that is not empty");
  try {
    cli::parse(app, args);
  } catch (const InvalidArgument& e) {
    throw UsageError(e.what());
  }
  MergeWeightsOptions options;
  options.checkpoint = checkpoint;
  options.output = output;
  options.overwrite = overwrite;
  if (dtype == "fp32" || dtype == "float32") {
    options.dtype = "F32";
  } else if (dtype == "bf16" || dtype == "bfloat16") {
    options.dtype = "BF16";
  } else if (dtype == "fp16" || dtype == "float16") {
    options.dtype = "F16";
  } else {
    throw UsageError("--dtype: '" + dtype + "' is not fp32, bf16 or fp16");
  }
  try {
    options.max_file_bytes = runtime::checkpoint::parseByteSize(max_shard_size);
  } catch (const InvalidArgument& e) {
    throw UsageError(std::string("--max_shard_size: ") + e.what());
  }
  return options;
}

}  // namespace

int runMergeWeights(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  const MergeWeightsOptions options = parseMergeWeightsArgs(args);
  const auto result = runtime::checkpoint::mergeWeights(options);
  for (const auto& note : result.notes) err << "cxxlaunch merge-weights: note: " << note << "\n";
  for (const auto& warning : result.warnings) {
    err << "cxxlaunch merge-weights: warning: " << warning << "\n";
  }
  char size[32];
  const double bytes = static_cast<double>(result.bytes);
  std::snprintf(size, sizeof(size), bytes >= 1e9 ? "%.3f GB" : "%.3f MB",
                bytes >= 1e9 ? bytes / 1e9 : bytes / 1e6);
  out << "merged '" << result.checkpoint << "' (saved at world " << result.world << ") into '"
      << options.output << "': " << result.tensors << " tensors, " << size << ", " << options.dtype
      << ":";
  for (const auto& file : result.files) out << " " << file;
  out << "\n";
  return kExitOk;
}

}  // namespace cxxlaunch::launcher
