#include "launcher/system_info.h"

#include <grpcpp/grpcpp.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/command_line.h"
#include "launcher/config.h"

// Set by launcher/CMakeLists.txt from the headers it found; absent means not found.
#ifndef CXXLAUNCH_TORCH_VERSION
#define CXXLAUNCH_TORCH_VERSION "not found"
#endif
#ifndef CXXLAUNCH_NCCL_VERSION
#define CXXLAUNCH_NCCL_VERSION "not found"
#endif
#ifndef CXXLAUNCH_CUDART_VERSION
#define CXXLAUNCH_CUDART_VERSION "not found"
#endif

namespace cxxlaunch::launcher {
namespace {

namespace fs = std::filesystem;

// The text after "KEY:" on the first line of `path` that starts with `key`, trimmed.
std::string field(const fs::path& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with(key)) continue;
    const auto colon = line.find(':');
    std::string value = colon == std::string::npos ? line : line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    return value;
  }
  return "";
}

std::string firstLine(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string ram() {
  const std::string kb = field("/proc/meminfo", "MemTotal");
  if (kb.empty()) return "not found";
  std::ostringstream out;
  out.precision(3);
  out << std::stod(kb) / (1024.0 * 1024.0) << " GiB";
  return out.str();
}

std::string gpus() {
  std::string list;
  std::error_code ec;
  for (const auto& gpu : fs::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    std::string model = field(gpu.path() / "information", "Model");
    list +=
        "\n    " + gpu.path().filename().string() + ": " + (model.empty() ? "NVIDIA GPU" : model);
  }
  return list.empty() ? "none" : list;
}

std::string self() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "not found" : exe.string();
}

}  // namespace

std::string parseEnvArgs(const std::vector<std::string>& args) {
  CLI::App app("Versions, hardware and config, for a bug report.", "cxxlaunch env");
  cli::useConventions(app);
  std::string file;
  CLI::Option* given =
      app.add_option(cli::spellings("config_file"), file, "the config to show")->type_name("FILE");
  try {
    cli::parse(app, args);
  } catch (const InvalidArgument& e) {
    throw UsageError(e.what());
  }
  if (given->count() != 0 && file.empty()) throw UsageError("--config_file: give a file name");
  return file;
}

std::string describeSystem(const std::string& version, const std::string& config_file,
                           const HostInfo& host) {
  std::ostringstream out;
  utsname name{};
  ::uname(&name);
  const std::string driver = firstLine("/proc/driver/nvidia/version");
  const std::string cpu = field("/proc/cpuinfo", "model name");
  out << "Copy and paste the text below into your bug report:\n\n"
      << "- cxxlaunch version: " << version << "\n"
      << "- cxxlaunch binary: " << self() << "\n"
      << "- Platform: " << name.sysname << " " << name.release << " " << name.machine << "\n"
      << "- LibTorch version (build time): " << CXXLAUNCH_TORCH_VERSION << "\n"
      << "- NCCL version (build time): " << CXXLAUNCH_NCCL_VERSION << "\n"
      << "- CUDA runtime version (build time): " << CXXLAUNCH_CUDART_VERSION << "\n"
      << "- CUDA driver: " << (driver.empty() ? "none" : driver) << "\n"
      << "- gRPC version: " << grpc::Version() << "\n"
      << "- CPU: " << (cpu.empty() ? "not found" : cpu) << " (" << host.cpus << " usable)\n"
      << "- RAM: " << ram() << "\n"
      << "- GPUs: " << gpus() << "\n";
  std::string path = config_file;
  std::error_code ec;
  if (path.empty() && fs::exists(host.default_config, ec)) path = host.default_config;
  if (path.empty()) {
    out << "- Config: not found (" << host.default_config << " does not exist)\n";
    return out.str();
  }
  out << "- Config: " << path << "\n";
  try {
    const Config config = loadConfigFile(path);
    for (const auto& [key, setting] : config.values()) {
      out << "    - " << key << ": " << setting.value << "\n";
    }
    for (const auto& [key, text] : config.ignored)
      out << "    - " << key << ": " << text << " (ignored)\n";
  } catch (const ConfigError& e) {
    out << "    (does not load: " << e.what() << ")\n";
  }
  return out.str();
}

}  // namespace cxxlaunch::launcher
