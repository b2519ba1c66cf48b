#include "launcher/process.h"

#include <fcntl.h>
#include <linux/limits.h>
#include <linux/sched.h>  // clone_args, CLONE_INTO_CGROUP
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <new>
#include <optional>
#include <random>

#include "common/error.h"
#include "launcher/cgroup.h"

extern char** environ;  // NOLINT(readability-redundant-declaration)

// Built with -fsanitize=thread or =address (GCC says so with a macro, Clang through
// __has_feature).
#if defined(__SANITIZE_THREAD__)
#define CXXLAUNCH_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CXXLAUNCH_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define CXXLAUNCH_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CXXLAUNCH_ASAN 1
#endif
#endif

namespace cxxlaunch::launcher {
namespace {

std::vector<char*> cStrings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// What the child needs, prepared before it exists; `error` is how it reports a failed exec (the
// child shares our memory until it execs).
struct ChildArgs {
  const char* program;
  char* const* argv;
  char* const* envp;
  pid_t parent;
  int out_fd;
  int err_fd;
  int cgroup_fd;  // -1: no cgroup to enter
  int error = 0;
  int cgroup_error = 0;
  int error_fd = -1;  // a forked child (not sharing our memory) reports `error` through it
};

// Runs in the child, on its own stack, sharing the parent's memory until execve: only
// async-signal-safe calls, and nothing that allocates.
int execChild(void* raw) {
  auto* args = static_cast<ChildArgs*>(raw);
  auto fail = [args]() {
    args->error = errno;
    if (args->error_fd != -1) {
      ssize_t ignored = ::write(args->error_fd, &args->error, sizeof(args->error));
      (void)ignored;
    }
    ::_exit(127);
  };
  if (::setpgid(0, 0) == -1) fail();
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) == -1) fail();
  if (::getppid() != args->parent) ::_exit(127);  // the agent died before prctl took effect
  // Before exec, so that nothing the worker starts is ever outside the cgroup. Writing "0" moves
  // the writer. Should the cgroup refuse, the worker runs without it and the agent says so.
  if (args->cgroup_fd != -1 && ::write(args->cgroup_fd, "0", 1) != 1) args->cgroup_error = errno;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
  }
  int null_fd = ::open("/dev/null", O_RDONLY);
  if (null_fd == -1 || ::dup2(null_fd, STDIN_FILENO) == -1) fail();
  if (::dup2(args->out_fd, STDOUT_FILENO) == -1 || ::dup2(args->err_fd, STDERR_FILENO) == -1) {
    fail();
  }
  sigset_t none;
  sigemptyset(&none);
  if (::sigprocmask(SIG_SETMASK, &none, nullptr) == -1) fail();
  ::execve(args->program, args->argv, args->envp);
  fail();
  return 127;
}

#if defined(__x86_64__) && defined(CLONE_INTO_CGROUP)
// clone3 with the child running `fn(arg)` on the stack `ca` names and exiting with its result,
// as glibc's clone() does for clone(2): a child that shares our memory on another stack must
// not return into this frame. There is no glibc wrapper. Returns the child's pid, or -errno.
long clone3Run(clone_args* ca, int (*fn)(void*), void* arg) {
  long ret;
  register long fn_reg asm("r12") = reinterpret_cast<long>(fn);    // callee-saved: the child
  register long arg_reg asm("r13") = reinterpret_cast<long>(arg);  // starts with our registers
  asm volatile(
      "syscall\n\t"
      "test %%rax, %%rax\n\t"
      "jnz 1f\n\t"
      "xor %%ebp, %%ebp\n\t"  // the child: the outermost frame
      "mov %%r13, %%rdi\n\t"
      "call *%%r12\n\t"
      "mov %%eax, %%edi\n\t"
      "mov $60, %%eax\n\t"  // SYS_exit
      "syscall\n\t"
      "hlt\n"
      "1:"
      : "=a"(ret)
      : "0"(static_cast<long>(SYS_clone3)), "D"(ca), "S"(sizeof(*ca)), "r"(fn_reg), "r"(arg_reg)
      : "rcx", "r11", "memory");
  return ret;
}
#endif

// The child, on `stack` (`size` bytes), in the job's cgroup from its first instruction where
// clone3 can put it there (CLONE_INTO_CGROUP: Linux 5.7, x86-64): moving a process afterwards
// (a write to cgroup.procs) waits for an RCU grace period, 10-20 ms measured, on the launcher's
// start-up path; this costs about 30 us. Elsewhere (no clone3, a seccomp filter that refuses it,
// another architecture) the child writes to cgroup.procs itself.
[[maybe_unused]] pid_t cloneChild(ChildArgs& args, char* stack, size_t size, int cgroup_dir_fd) {
#if defined(__x86_64__) && defined(CLONE_INTO_CGROUP)
  if (cgroup_dir_fd != -1) {
    clone_args ca{};
    ca.flags = CLONE_VM | CLONE_VFORK | CLONE_INTO_CGROUP;
    ca.exit_signal = SIGCHLD;
    ca.stack = reinterpret_cast<uintptr_t>(stack);
    ca.stack_size = size;
    ca.cgroup = static_cast<uint64_t>(cgroup_dir_fd);
    const int procs_fd = args.cgroup_fd;
    args.cgroup_fd = -1;  // already in it
    const long pid = clone3Run(&ca, execChild, &args);
    if (pid > 0) return static_cast<pid_t>(pid);
    args.cgroup_fd = procs_fd;
  }
#else
  (void)cgroup_dir_fd;
#endif
  return ::clone(execChild, stack + size, CLONE_VM | CLONE_VFORK | SIGCHLD, &args);
}

}  // namespace

// clone(CLONE_VM | CLONE_VFORK), as posix_spawn does: the agent hosts gRPC threads and a few
// MiB of heap, and a fork would copy its page tables and make every thread fault on the pages
// it then writes. posix_spawn itself cannot set PR_SET_PDEATHSIG, hence our own child function.
SpawnedProcess spawnProcess(const SpawnSpec& spec) {
  auto argv = cStrings(spec.argv);
  auto envp = cStrings(spec.env);
  int out[2], err[2];
  CXXLAUNCH_SYSCALL(::pipe2(out, O_CLOEXEC));
  CXXLAUNCH_SYSCALL(::pipe2(err, O_CLOEXEC));
  ChildArgs args{spec.program.c_str(), argv.data(), envp.data(), ::getpid(), out[1], err[1],
                 spec.cgroup_procs_fd};
  constexpr size_t kStackSize = 64 * 1024;
  std::unique_ptr<char[]> stack(new char[kStackSize]);
  // No signal handler may run on the child's borrowed memory before it resets them.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
#if defined(CXXLAUNCH_TSAN)
  // ThreadSanitizer takes clone() for a fork, and with the child sharing our memory it then
  // believes this process forked while it had threads: it kills the next thread we start.
  // Under TSan the child is a plain fork (what TSan makes of vfork too) and reports a failed
  // exec through a close-on-exec pipe: EOF means the exec happened. (It still writes itself
  // into the job's cgroup; a failure there is not reported back under TSan.)
  int report[2];
  CXXLAUNCH_SYSCALL(::pipe2(report, O_CLOEXEC));
  args.error_fd = report[1];
  const pid_t pid = ::fork();
  if (pid == 0) execChild(&args);
  const int clone_errno = errno;
  ::close(report[1]);
  if (pid != -1) {
    while (::read(report[0], &args.error, sizeof(args.error)) == -1 && errno == EINTR) {
    }
  }
  ::close(report[0]);
#else
  // Grows down from its end; leave a little room (and keep the top 16-byte aligned).
  const pid_t pid = cloneChild(args, stack.get(), kStackSize - 64, spec.cgroup_dir_fd);
  const int clone_errno = errno;
#endif
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ::close(out[1]);
  ::close(err[1]);
  if (pid == -1 || args.error != 0) {
    ::close(out[0]);
    ::close(err[0]);
    if (pid == -1) throw SystemError("clone", clone_errno);
    ::waitpid(pid, nullptr, 0);  // the child already _exit-ed
    // The child's set-up (its /dev/null, its pipes) or its exec: "starting", not "exec".
    throw SystemError("starting " + spec.program, args.error);
  }
  CXXLAUNCH_SYSCALL(::fcntl(out[0], F_SETFL, O_NONBLOCK));
  CXXLAUNCH_SYSCALL(::fcntl(err[0], F_SETFL, O_NONBLOCK));
  return {pid, out[0], err[0], args.cgroup_error};
}

namespace {

// The state letter and parent of a process from its /proc/PID/stat; false when it is gone.
bool readStat(const std::filesystem::path& stat_file, char& state, long& ppid) {
  std::ifstream in(stat_file);
  std::string stat;
  std::getline(in, stat);
  // pid (comm) state ppid ...; comm may hold spaces and parentheses: parse after the last ')'.
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return false;
  return std::sscanf(stat.c_str() + close + 1, " %c %ld", &state, &ppid) == 2;
}

}  // namespace

std::string processState(pid_t pid) {
  char state = 0;
  long ppid = 0;
  if (pid <= 0 || !readStat("/proc/" + std::to_string(pid) + "/stat", state, ppid)) return "gone";
  switch (state) {
    case 'R':
      return "running";
    case 'S':
      return "sleeping";
    case 'D':
      return "disk-wait";
    case 'T':
      return "stopped";
    case 't':
      return "traced";
    case 'Z':
    case 'X':
      return "zombie";
    case 'I':
      return "idle";
    default:
      return std::string(1, state);
  }
}

namespace {

bool live(char state) { return state != 'Z' && state != 'X'; }

// Our own children from /proc/self/task/TID/children (a child hangs under the thread that
// forked it, an orphan under whichever thread took it in): a few small files instead of one per
// process on the machine. nullopt where the kernel has no such files (CONFIG_PROC_CHILDREN).
std::optional<std::vector<pid_t>> ownChildren() {
  std::vector<pid_t> children;
  std::error_code ec;
  bool any = false;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream in(task.path() / "children");
    if (!in) continue;  // a thread that ended meanwhile
    any = true;
    for (std::string pid; in >> pid;) {
      // The list holds zombies too; a child may be one already.
      char state = 0;
      long ppid = 0;
      if (readStat("/proc/" + pid + "/stat", state, ppid) && live(state)) {
        children.push_back(static_cast<pid_t>(std::stol(pid)));
      }
    }
  }
  if (ec || !any) return std::nullopt;
  return children;
}

}  // namespace

std::vector<pid_t> childrenOf(pid_t parent) {
  if (parent == ::getpid()) {
    if (auto own = ownChildren()) return *own;
  }
  std::vector<pid_t> children;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    char state = 0;
    long ppid = 0;
    if (!readStat(entry.path() / "stat", state, ppid)) continue;
    if (ppid == parent && live(state)) {
      children.push_back(static_cast<pid_t>(std::stol(name)));
    }
  }
  return children;
}

namespace {

constexpr size_t kWatchdogSlots = 4096;
// The helper's stack: removeCgroup's walk holds a few path buffers per level of the tree.
constexpr size_t kWatchdogStack = 256 * 1024;

// What the helper works with, in a mapping of its own (GroupWatchdog's constructor): made before
// it starts, touched only by it, unmapped by the destructor once it has been reaped.
struct WatchdogState {
  std::array<int32_t, kWatchdogSlots> groups;  // the process groups to kill; 0: a free slot
  std::array<char, PATH_MAX> cgroup_dir;       // the cgroup to remove; "": none
  int fd;                                      // the pipe's read end
  alignas(16) std::array<char, kWatchdogStack> stack;
};

// A raw read(2): the helper may share the agent's memory (GroupWatchdog), and glibc's read
// would mark the cancellation state of the thread that started it while it waits. Fails only
// at EOF (the agent is gone): no signal the helper keeps reaches it with a handler.
ssize_t rawRead(int fd, void* data, size_t size) { return ::syscall(SYS_read, fd, data, size); }

// Reads exactly `size` bytes; false at EOF or an error. Async-signal-safe.
bool readExactly(int fd, void* data, size_t size) {
  auto* at = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = rawRead(fd, at, size);
    if (n == -1 && errno == EINTR) continue;
    if (n <= 0) return false;
    at += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// The helper's loop: only async-signal-safe calls, no allocation (it runs in a fork of a
// possibly threaded process, or in its memory). A message is one int32: a group to watch (> 0)
// or to forget (< 0), or 0 followed by an int32 length and the path of the cgroup to remove.
[[noreturn]] void watchdogMain(WatchdogState& state) {
  const int fd = state.fd;
  ::setpgid(0, 0);  // Ctrl-C at the terminal is for the agent, not for us
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE, SIGTSTP}) {
    ::signal(sig, SIG_IGN);
  }
  // The agent's sockets and pipes are not ours to hold open.
  if (fd > 0) ::close_range(0, static_cast<unsigned>(fd) - 1, 0);
  ::close_range(static_cast<unsigned>(fd) + 1, ~0U, 0);
  auto& groups = state.groups;
  auto& cgroup_dir = state.cgroup_dir;
  int32_t message = 0;
  while (readExactly(fd, &message, sizeof(message))) {  // EOF: the agent is gone
    if (message == 0) {
      int32_t size = 0;
      if (!readExactly(fd, &size, sizeof(size)) || size < 0 ||
          static_cast<size_t>(size) >= cgroup_dir.size() ||
          !readExactly(fd, cgroup_dir.data(), static_cast<size_t>(size))) {
        break;
      }
      cgroup_dir[static_cast<size_t>(size)] = '\0';
      continue;
    }
    for (auto& slot : groups) {
      if (message > 0 && slot == 0) {
        slot = message;
        break;
      }
      if (message < 0 && slot == -message) {
        slot = 0;
        break;
      }
    }
  }
  for (int32_t group : groups) {
    if (group > 0) ::kill(-group, SIGKILL);
  }
  // Everything the workers started, however it detached; then the cgroup itself.
  if (cgroup_dir[0] != '\0') removeCgroup(cgroup_dir.data(), 10'000);
  ::_exit(0);
}

// Starts the helper on its own stack in our memory (CLONE_VM without CLONE_THREAD: a process of
// its own, which a SIGKILL of the agent leaves alive, and which keeps the memory alive). A fork
// would copy the agent's page tables and turn every page the agent writes afterwards into a
// copy-on-write fault: on a paravirtualised machine, 13 us each, a millisecond or two of the
// launch. The helper shares no thread's locks: it allocates nothing and writes nothing but its
// own state; the errno it may set after EOF belongs to a thread that is then waiting for it (the
// destructor) or gone. No exit signal: a clone child, which waitpid(-1) and waitid(P_ALL) do not
// see unless asked (__WALL), so that "no child left" means no orphan of the job's is left
// (WorkerGroup::stopLeftovers). Under the sanitizers, whose runtimes take any clone for a thread
// or a fork, it is forked.
pid_t startWatchdog(WatchdogState& state) {
#if defined(CXXLAUNCH_TSAN) || defined(CXXLAUNCH_ASAN)
  const pid_t pid = ::fork();
  if (pid == 0) watchdogMain(state);
  return pid;
#else
  auto entry = [](void* arg) -> int { watchdogMain(*static_cast<WatchdogState*>(arg)); };
  return ::clone(entry, state.stack.data() + state.stack.size(), CLONE_VM, &state);
#endif
}

}  // namespace

GroupWatchdog::GroupWatchdog(const std::string& cgroup_dir) {
  void* memory = ::mmap(nullptr, sizeof(WatchdogState), PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (memory == MAP_FAILED) throw SystemError("mmap (watchdog)", errno);
  // Zeroed by mmap: no groups, no cgroup. (Default-initialised: a value-initialisation would
  // write, and fault in, the whole stack.)
  auto* state = new (memory) WatchdogState;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    const int err = errno;
    ::munmap(memory, sizeof(WatchdogState));
    throw SystemError("pipe (watchdog)", err);
  }
  state->fd = fds[0];
  const pid_t pid = startWatchdog(*state);
  const int err = errno;
  ::close(fds[0]);
  if (pid == -1) {
    ::close(fds[1]);
    ::munmap(memory, sizeof(WatchdogState));
    throw SystemError("clone (watchdog)", err);
  }
  pid_ = pid;
  fd_ = fds[1];
  state_ = memory;
  if (!cgroup_dir.empty()) watchCgroup(cgroup_dir);
}

GroupWatchdog::~GroupWatchdog() {
  if (fd_ != -1) ::close(fd_);
  // It exits at once now; reaped here, it leaves no zombie under an init that does not reap.
  if (pid_ > 0) ::waitpid(pid_, nullptr, __WALL);
  if (state_ != nullptr) ::munmap(state_, sizeof(WatchdogState));
}

void GroupWatchdog::add(pid_t group) {
  const auto message = static_cast<int32_t>(group);
  ssize_t ignored = ::write(fd_, &message, sizeof(message));  // 4 bytes: atomic on a pipe
  (void)ignored;
}

void GroupWatchdog::remove(pid_t group) {
  const auto message = -static_cast<int32_t>(group);
  ssize_t ignored = ::write(fd_, &message, sizeof(message));
  (void)ignored;
}

void GroupWatchdog::watchCgroup(const std::string& dir) {
  // One write of at most PIPE_BUF bytes: atomic, never interleaved with add() and remove().
  const int32_t header[2] = {0, static_cast<int32_t>(dir.size())};
  if (sizeof(header) + dir.size() > PIPE_BUF || dir.size() >= PATH_MAX) {
    throw InvalidArgument("cgroup path too long: " + dir);
  }
  char message[PIPE_BUF];
  std::memcpy(message, header, sizeof(header));
  std::memcpy(message + sizeof(header), dir.data(), dir.size());
  ssize_t ignored = ::write(fd_, message, sizeof(header) + dir.size());
  (void)ignored;
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
