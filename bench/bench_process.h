#pragma once
// What the rendezvous benchmarks need of the processes they start: spawn and stop one, a
// cxxlaunchd on a port of its choosing (its endpoint read from its first line), and a process's
// CPU time and peak resident memory, read from /proc.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace cxxlaunch::bench {

// `stdout_fd`, `stderr_fd`: where its output goes (-1: ours).
inline pid_t spawn(const std::vector<std::string>& argv, int stdout_fd = -1, int stderr_fd = -1) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (stdout_fd >= 0) ::dup2(stdout_fd, 1);
    if (stderr_fd >= 0) ::dup2(stderr_fd, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

inline void stop(pid_t pid) {
  ::kill(pid, SIGTERM);
  ::waitpid(pid, nullptr, 0);
}

// The CPU time process `pid` has used so far (user + system), in seconds.
inline double cpuSeconds(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  std::istringstream fields(text.substr(text.rfind(')') + 2));  // after "pid (comm) "
  std::string field;
  long long utime = 0, stime = 0;
  for (int i = 3; fields >> field; ++i) {  // field 3 is the state
    if (i == 14) utime = std::stoll(field);
    if (i == 15) {
      stime = std::stoll(field);
      break;
    }
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// Its peak resident set so far (VmHWM), in MiB; 0 if unknown.
inline double peakResidentMiB(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024;
  }
  return 0;
}

// A cxxlaunchd listening on a port it chose, stopped with the object.
struct Daemon {
  pid_t pid = -1;
  std::string endpoint;

  explicit Daemon(const std::string& path) {
    int out[2];
    if (::pipe(out) != 0) throw std::runtime_error("pipe");
    pid = spawn({path, "--port", "0"}, out[1]);
    ::close(out[1]);
    std::string text;
    char c;
    while (text.find('\n') == std::string::npos && ::read(out[0], &c, 1) == 1) text.push_back(c);
    ::close(out[0]);
    std::smatch m;
    if (!std::regex_search(text, m, std::regex("listening on (\\S+)"))) {
      throw std::runtime_error("cxxlaunchd did not start: " + text);
    }
    endpoint = m[1];
  }
  ~Daemon() { stop(pid); }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;
};

}  // namespace cxxlaunch::bench
