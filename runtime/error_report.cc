#include "runtime/error_report.h"

#include <c10/util/Exception.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/error.h"

namespace cxxlaunch::runtime {
namespace {

std::string& errorFile() {
  static std::string path;
  return path;
}
std::terminate_handler previous = nullptr;

struct Hint {
  std::string pattern, hint;
};
std::mutex hints_mutex;
std::vector<Hint>& hints() {
  static std::vector<Hint> all;
  return all;
}

// `what`, with the hints its message calls for.
std::string explained(const std::string& what) {
  std::string out = what;
  std::lock_guard<std::mutex> lock(hints_mutex);
  for (const Hint& h : hints()) {
    if (what.find(h.pattern) != std::string::npos) out += "\n" + h.hint;
  }
  return out;
}

[[noreturn]] void reportAndExit() {
  if (const std::exception_ptr error = std::current_exception()) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      // LibTorch's errors carry a C++ stack trace in what(): the message alone is for the user.
      const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
      const std::string message =
          explained(torch_error ? torch_error->what_without_backtrace() : e.what());
      std::cout.flush();
      // One write: the launcher may stop this worker any moment once a peer failed.
      const std::string line = "error: " + message + "\n";
      [[maybe_unused]] const auto written = ::write(STDERR_FILENO, line.data(), line.size());
      if (!errorFile().empty()) std::ofstream(errorFile()) << errorFileJson(message);
      // Not exit(): other threads (a backend's) may hold locks that static destructors take.
      std::fflush(nullptr);
      ::_exit(exitCodeOf(e));
    } catch (...) {
    }
  }
  previous();
  std::abort();  // a handler that returned
}

}  // namespace

int exitCodeOf(const std::exception& error) {
  return dynamic_cast<const InvalidArgument*>(&error) != nullptr ? 2 : 1;
}

std::string errorFileJson(const std::string& message) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  nlohmann::json report = {
      {"message",
       {{"message", message},
        {"extraInfo",
         {{"timestamp",
           std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now).count())}}}}}};
  return report.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void installUncaughtErrorReport(const std::string& error_file) {
  static std::once_flag once;
  std::call_once(once, [&] {
    errorFile() = error_file;
    previous = std::set_terminate(reportAndExit);
  });
}

void addUncaughtErrorHint(const std::string& pattern, const std::string& hint) {
  std::lock_guard<std::mutex> lock(hints_mutex);
  for (const Hint& h : hints()) {
    if (h.pattern == pattern && h.hint == hint) return;
  }
  hints().push_back({pattern, hint});
}

}  // namespace cxxlaunch::runtime
