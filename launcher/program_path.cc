#include "launcher/program_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "launcher/cli.h"
#include "launcher/flag_values.h"

namespace cxxlaunch::launcher {

std::string findProgram(const std::string& program, const std::string& path) {
  namespace fs = std::filesystem;
  auto executable = [](const fs::path& candidate) {
    struct stat st {};
    return ::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
           ::access(candidate.c_str(), X_OK) == 0;
  };
  auto hint = [&]() -> std::string {
    if (program.size() > 3 && program.ends_with(".py")) {
      return "; to run a Python script, name the interpreter: cxxlaunch run python3 " + program;
    }
    return "";
  };
  if (program.find('/') != std::string::npos) {
    std::error_code ec;
    if (!fs::exists(program, ec)) throw UsageError("program '" + program + "' does not exist");
    if (!executable(program)) {
      throw UsageError("program '" + program + "' is not an executable file" + hint());
    }
    return program;
  }
  for (const auto& dir : split(path, ':')) {
    fs::path candidate = fs::path(dir.empty() ? "." : dir) / program;
    if (executable(candidate)) return candidate.string();
  }
  throw UsageError("program '" + program + "' was not found on PATH" + hint());
}

}  // namespace cxxlaunch::launcher
