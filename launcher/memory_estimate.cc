#include "launcher/memory_estimate.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "common/command_line.h"
#include "common/file.h"
#include "launcher/cli.h"
#include "launcher/config.h"
#include "rendezvous/run_state.h"

namespace cxxlaunch::launcher {
namespace {

double parseCount(const std::string& what, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !(v > 0) || !std::isfinite(v)) {
    throw UsageError(what + ": '" + text + "' is not a positive number (e.g. 7e9)");
  }
  return v;
}

void loadLayers(const std::string& path, MemoryEstimateOptions& options) {
  std::string text;
  try {
    text = readRegularFile(path, "--config", kMaxConfigFileBytes);  // not a FIFO, not /dev/zero
  } catch (const InvalidArgument& e) {
    throw UsageError(e.what());
  }
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw UsageError(path + ":" + std::to_string(e.mark.line + 1) + ":" +
                     std::to_string(e.mark.column + 1) + ": YAML syntax error: " + e.msg);
  }
  const YAML::Node layers = root.IsMap() ? root["layers"] : YAML::Node();
  if (!layers.IsSequence() || layers.size() == 0) {
    throw UsageError(path +
                     ": expected `layers:` with a list of parameter counts or of "
                     "{name: ..., params: ...}");
  }
  options.params = 0;
  for (const auto& layer : layers) {
    const YAML::Node count = layer.IsMap() ? layer["params"] : layer;
    const std::string where = path + ":" + std::to_string(layer.Mark().line + 1) + ":" +
                              std::to_string(layer.Mark().column + 1);
    if (!count.IsScalar()) throw UsageError(where + ": a layer needs a parameter count");
    const double n = parseCount(where, count.Scalar());
    options.params += n;
    options.largest_layer = std::max(options.largest_layer, n);
  }
}

std::string inUnit(double bytes, double unit) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", bytes / unit);
  return text;
}

}  // namespace

std::vector<MemoryRow> estimateMemory(const MemoryEstimateOptions& o) {
  std::vector<MemoryRow> rows;
  const double psi = o.params, n = o.ranks;
  for (const auto& dtype : o.dtypes) {
    // cxxlaunch's layout (docs/config.md): in fp32 the parameters are the master weights and the
    // gradient shard is a slice of the gradient; in mixed precision the model holds 2-byte
    // compute copies, the fp32 masters and the fp32 gradient shards are apart, and below stage
    // 2 the 2-byte full gradient stays.
    const bool fp32 = dtype == "fp32";
    const double copy = fp32 ? 4 : 2, master = fp32 ? 0 : 4, full_grad = fp32 ? 0 : 2;
    const double grad = 4, state = 8;
    auto add = [&](const char* strategy, double memory, double offloaded) {
      rows.push_back({dtype, strategy, memory * psi, offloaded * psi});
    };
    add("ddp", copy + master + full_grad + grad + state, 0);
    add("zero1", copy + full_grad + (fp32 ? grad : 0) + ((fp32 ? 0 : master + grad) + state) / n,
        0);
    add("zero2", copy + (master + grad + state) / n, 0);
    add("zero3", (4 + grad + state) / n, 0);  // at rest: fp32 masters, no compute copy
    add("zero2+offload", copy + (master + grad) / n, state / n);
    add("zero3+offload", (4 + grad) / n, state / n);
    add("zero3+offload+params", grad / n, (4 + state) / n);
    // cpu offload of a GPU run: the fp32 master, the fp32 gradient shard and the state in host
    // memory; the device keeps the compute copies (stage 3: its shard of them, or nothing).
    add("zero2+cpu", copy, (4 + grad + state) / n);
    add("zero3+cpu", copy / n, (4 + grad + state) / n);
    add("zero3+cpu+params", 0, (4 + grad + state) / n);
  }
  return rows;
}

MemoryEstimateOptions parseEstimateArgs(const std::vector<std::string>& args) {
  CLI::App app("Memory per rank of the model states in each mode (DDP, ZeRO-1/2/3, offload).",
               "cxxlaunch estimate-memory");
  cli::useConventions(app);
  CLI::Option* params = app.add_option(cli::spellings("params"))
                            ->type_name("N")
                            ->description("parameters of the model, e.g. 7e9");
  CLI::Option* config = app.add_option(cli::spellings("config"))
                            ->type_name("FILE")
                            ->description("YAML list of the layers' parameter counts");
  CLI::Option* num_processes = app.add_option(cli::spellings("num_processes"))
                                   ->type_name("N")
                                   ->description("ranks that share the model (default 1)");
  CLI::Option* dtypes = app.add_option(cli::spellings("dtypes"))
                            ->type_name("LIST")
                            ->description("fp32,bf16,fp16 (default all)");
  try {
    cli::parse(app, args);
  } catch (const InvalidArgument& e) {
    throw UsageError(e.what());
  }
  MemoryEstimateOptions options;
  bool have_size = false;
  // In the order typed, so that the first mistake is the one reported.
  for (const auto& [option, value] : cli::givenInOrder(app)) {
    if (option == params) {
      options.params = parseCount("--params", value);
      have_size = true;
    } else if (option == config) {
      loadLayers(value, options);
      have_size = true;
    } else if (option == num_processes) {
      const double ranks = parseCount("--num_processes", value);
      // Checked before the conversion: a double past int's range does not convert.
      if (ranks != std::floor(ranks) || ranks > static_cast<double>(rendezvous::kMaxWorldSize)) {
        throw UsageError("--num_processes: '" + value + "' is not a whole number from 1 to " +
                         std::to_string(rendezvous::kMaxWorldSize));
      }
      options.ranks = static_cast<int>(ranks);
    } else if (option == dtypes) {
      options.dtypes.clear();
      std::istringstream in(value);
      std::string dtype;
      while (std::getline(in, dtype, ',')) {
        if (dtype == "float32") dtype = "fp32";
        if (dtype == "bfloat16") dtype = "bf16";
        if (dtype == "float16") dtype = "fp16";
        if (dtype != "fp32" && dtype != "bf16" && dtype != "fp16") {
          throw UsageError("--dtypes: '" + dtype + "' is not fp32, bf16 or fp16");
        }
        options.dtypes.push_back(dtype);
      }
      if (options.dtypes.empty()) throw UsageError("--dtypes: give at least one of fp32,bf16,fp16");
    }
  }
  if (!have_size) {
    throw UsageError("give the model size: --params 7e9, or --config layers.yaml");
  }
  return options;
}

std::string formatEstimate(const MemoryEstimateOptions& options) {
  std::ostringstream out;
  char line[160];
  std::snprintf(line, sizeof(line), "Model states per rank for %.4g parameters on %d rank(s)",
                options.params, options.ranks);
  out << line;
  if (options.largest_layer > 0) {
    std::snprintf(line, sizeof(line), " (largest layer %.4g)", options.largest_layer);
    out << line;
  }
  const auto rows = estimateMemory(options);
  double largest = 0;
  for (const auto& row : rows) largest = std::max({largest, row.gpu_bytes, row.cpu_bytes});
  // GB as the paper; MB for models too small for two decimals of GB to tell the modes apart.
  const bool gb = largest >= 1e9;
  const double unit = gb ? 1e9 : 1e6;
  out << ", Adam, in " << (gb ? "GB (1e9" : "MB (1e6")
      << " bytes);\nactivations and temporary buffers come on top.\n\n";
  std::snprintf(line, sizeof(line), "%-6s %-22s %12s %12s\n", "dtype", "strategy",
                gb ? "memory GB" : "memory MB", gb ? "offload GB" : "offload MB");
  out << line;
  for (const auto& row : rows) {
    std::snprintf(line, sizeof(line), "%-6s %-22s %12s %12s\n", row.dtype.c_str(),
                  row.strategy.c_str(), inUnit(row.gpu_bytes, unit).c_str(),
                  inUnit(row.cpu_bytes, unit).c_str());
    out << line;
  }
  return out.str();
}

}  // namespace cxxlaunch::launcher
