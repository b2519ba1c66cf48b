#include "launcher/process.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <random>

#include "rendezvous/error.h"

extern char** environ;  // NOLINT(readability-redundant-declaration)

namespace cxxlaunch::launcher {
namespace {

std::vector<char*> cStrings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// Reports errno to the parent through the status pipe and ends the child.
[[noreturn]] void childFailed(int status_fd) {
  int err = errno;
  ssize_t ignored = ::write(status_fd, &err, sizeof(err));
  (void)ignored;
  ::_exit(127);
}

// Only async-signal-safe calls from here on: this runs between fork and exec.
[[noreturn]] void execChild(const char* program, char* const* argv, char* const* envp,
                            pid_t parent, int out_fd, int err_fd, int status_fd) {
  auto die = [status_fd]() { childFailed(status_fd); };
  if (::setpgid(0, 0) == -1) die();
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) == -1) die();
  if (::getppid() != parent) ::_exit(127);  // the agent died before prctl took effect
  sigset_t none;
  sigemptyset(&none);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
  }
  if (::sigprocmask(SIG_SETMASK, &none, nullptr) == -1) die();
  int null_fd = ::open("/dev/null", O_RDONLY);
  if (null_fd == -1 || ::dup2(null_fd, STDIN_FILENO) == -1) die();
  if (::dup2(out_fd, STDOUT_FILENO) == -1 || ::dup2(err_fd, STDERR_FILENO) == -1) die();
  ::execve(program, argv, envp);
  childFailed(status_fd);
}

}  // namespace

SpawnedProcess spawnProcess(const SpawnSpec& spec) {
  auto argv = cStrings(spec.argv);
  auto envp = cStrings(spec.env);
  int out[2], err[2], status[2];
  CXXLAUNCH_SYSCALL(::pipe2(out, O_CLOEXEC));
  CXXLAUNCH_SYSCALL(::pipe2(err, O_CLOEXEC));
  CXXLAUNCH_SYSCALL(::pipe2(status, O_CLOEXEC));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) execChild(spec.program.c_str(), argv.data(), envp.data(), parent, out[1], err[1],
                          status[1]);
  const int fork_errno = errno;
  ::close(out[1]);
  ::close(err[1]);
  ::close(status[1]);
  if (pid == -1) {
    ::close(out[0]);
    ::close(err[0]);
    ::close(status[0]);
    throw SystemError("fork", fork_errno);
  }
  ::setpgid(pid, pid);  // also in the parent, so signals sent right after spawn reach the group
  int child_errno = 0;
  ssize_t n;
  do {
    n = ::read(status[0], &child_errno, sizeof(child_errno));
  } while (n == -1 && errno == EINTR);
  ::close(status[0]);
  if (n == static_cast<ssize_t>(sizeof(child_errno))) {
    ::waitpid(pid, nullptr, 0);  // the child already _exit-ed
    ::close(out[0]);
    ::close(err[0]);
    throw SystemError("exec " + spec.program, child_errno);
  }
  CXXLAUNCH_SYSCALL(::fcntl(out[0], F_SETFL, O_NONBLOCK));
  CXXLAUNCH_SYSCALL(::fcntl(err[0], F_SETFL, O_NONBLOCK));
  return {pid, out[0], err[0]};
}

std::string signalName(int signal) {
  const char* abbrev = ::sigabbrev_np(signal);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "SIG" + std::to_string(signal);
}

std::string randomHex(int digits) {
  std::random_device device;
  std::uniform_int_distribution<int> hex(0, 15);
  std::string out;
  for (int i = 0; i < digits; ++i) out.push_back("0123456789abcdef"[hex(device)]);
  return out;
}

std::vector<std::string> currentEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

}  // namespace cxxlaunch::launcher
