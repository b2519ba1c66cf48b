#include "apps/finetune/lora.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "apps/finetune/output.h"
#include "common/error.h"
#include "common/file.h"
#include "common/utf8.h"

namespace cxxlaunch::finetune {

namespace fs = std::filesystem;

namespace {

// adapter_config.json is a few hundred bytes; a MiB leaves room for long module lists.
constexpr size_t kMaxAdapterConfigBytes = size_t{1} << 20;

std::vector<std::string> commaList(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const size_t begin = item.find_first_not_of(" \t"), end = item.find_last_not_of(" \t");
    out.push_back(begin == std::string::npos ? "" : item.substr(begin, end - begin + 1));
  }
  return out;
}

// The flag's name where the library's message names PEFT's field.
void checkAsFlags(const models::LoraConfig& config) {
  try {
    config.check();
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string("--") + e.what());
  }
}

}  // namespace

std::optional<LoraRun> loraRunOf(const Flags& f) {
  if (!f.lora()) return std::nullopt;
  LoraRun run;
  run.base = f.model_dir;
  if (f.adapter.empty()) {
    run.config.r = f.lora_r;
    run.config.alpha = f.lora_alpha;
    run.config.dropout = f.lora_dropout;
    run.config.target_modules = commaList(f.lora_target_modules);
    run.config.use_rslora = f.use_rslora;
    checkAsFlags(run.config);
    return run;
  }
  run.adapter = f.adapter;
  const std::string config = f.adapter + "/" + kAdapterConfig;
  if (!present(config) || !present(f.adapter + "/" + kAdapterWeights)) {
    throw InvalidArgument("--adapter '" + f.adapter + "' is not a PEFT adapter folder (it needs " +
                          kAdapterConfig + " and " + kAdapterWeights + ")");
  }
  run.config = models::adapterConfigFromJson(
      readRegularFile(config, "the adapter's config", kMaxAdapterConfigBytes), config);
  return run;
}

void addAdapters(models::LlamaForCausalLMImpl& model, LoraRun& run) {
  try {
    run.adapted = models::addLora(model, run.config);
  } catch (const InvalidArgument& e) {
    // The message names PEFT's field: the flag of that name, or the adapter's config.
    throw InvalidArgument(run.adapter.empty() ? "--" + std::string(e.what())
                                              : "--adapter '" + run.adapter + "': " + e.what());
  }
  if (!run.adapter.empty()) models::loadAdapterWeights(model, run.adapter + "/" + kAdapterWeights);
}

std::string describe(const LoraRun& run, const torch::nn::Module& model) {
  int64_t trainable = 0, all = 0;
  for (const auto& p : model.parameters()) {
    all += p.numel();
    if (p.requires_grad()) trainable += p.numel();
  }
  std::string targets;
  for (const auto& t : run.config.target_modules) targets += (targets.empty() ? "" : ",") + t;
  const std::string from = run.adapter.empty() ? "" : " from " + run.adapter;
  char line[512];
  std::snprintf(line, sizeof(line),
                "LoRA r %lld alpha %g%s (scale %g) dropout %g on %s in %zu modules%s: %lld "
                "trainable parameters of %lld (%.3g%%), the base frozen",
                static_cast<long long>(run.config.r), run.config.alpha,
                run.config.use_rslora ? " rslora" : "", run.config.scale(), run.config.dropout,
                targets.c_str(), run.adapted.size(), from.c_str(),
                static_cast<long long>(trainable), static_cast<long long>(all),
                100.0 * static_cast<double>(trainable) / static_cast<double>(all));
  return line;
}

void dumpFrozenIfAsked(runtime::Accelerator& acc, const torch::nn::Module& model) {
  const char* path = std::getenv(kDumpFrozenEnv);  // NOLINT(concurrency-mt-unsafe)
  if (path == nullptr || *path == '\0') return;
  std::vector<std::pair<std::string, torch::Tensor>> frozen;
  for (const auto& item : model.named_parameters()) {
    if (!item.value().requires_grad()) {
      frozen.emplace_back(item.key(), item.value().detach().to(torch::kCPU).contiguous());
    }
  }
  acc.save(path, frozen);
}

void writeAdapterExport(runtime::Accelerator& acc, const LoraRun& run, const std::string& out,
                        const std::string& model_dir, const std::vector<CopiedFile>& files) {
  // Every rank gathers (the adapters are a fraction of the model; the frozen base is not
  // copied); rank 0 writes.
  const auto tensors = models::peftTensors(acc.fullParameters(models::isLoraParameter));
  std::error_code ec;
  fs::path base = fs::absolute(model_dir, ec).lexically_normal();
  if (!base.has_filename()) base = base.parent_path();  // "model/"
  // A path is bytes; JSON is UTF-8 (nlohmann refuses other bytes): as Python would write it.
  writeAdapter(acc, out, model_dir, files,
               models::adapterConfigJson(run.config, run.adapted,
                                         backslashReplaceInvalidUtf8(base.string())),
               tensors);
}

}  // namespace cxxlaunch::finetune
