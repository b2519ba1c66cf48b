#include "launcher/remote.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>

#include "common/error.h"
#include "launcher/process.h"

namespace cxxlaunch::launcher {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kPassedOn[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
bool stopsJob(int sig) { return sig != SIGUSR1 && sig != SIGUSR2; }

// How long past the agents' own shutdown grace the hosts get to report before their ssh is
// stopped (which ends the remote shell's input: SIGTERM there too).
constexpr auto kReportSlack = std::chrono::seconds(10);
// A host whose agent failed the job (any exit but ssh's 255): the rendezvous tells the others,
// which then end with the job's root cause on their own. Those still running after this are
// told to stop (an agent that failed before it joined leaves the others waiting to join).
constexpr auto kFailureSettle = std::chrono::seconds(15);

void writeAll(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n == -1 && errno == EINTR) {
      continue;
    } else if (n == -1 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
    } else {
      return;  // a closed console: nothing more to say there
    }
  }
}

struct Node {
  std::string host;
  pid_t pid = -1;
  int in = -1;                  // the remote shell's input: signal names, one per line
  int fds[2] = {-1, -1};        // its stdout and stderr
  std::string partial[2];       // the unfinished line of each
  std::string last_error_line;  // ssh's last words on stderr, for the report
  bool running = false;
  bool told_to_stop = false;  // by us, because another host failed or a signal came
  int exit_code = 0;
  Clock::time_point ended;
};

// Each complete line of `n`'s `stream` goes to our own, as "HOST: line".
void relay(Node& n, int stream, const char* data, size_t size, bool eof) {
  std::string& partial = n.partial[stream];
  partial.append(data, size);
  std::string out;
  size_t start = 0;
  for (size_t nl = partial.find('\n'); nl != std::string::npos; nl = partial.find('\n', start)) {
    const std::string line = partial.substr(start, nl - start);
    out += n.host + ": " + line + "\n";
    if (stream == 1 && !line.empty()) n.last_error_line = line;
    start = nl + 1;
  }
  partial.erase(0, start);
  if (eof && !partial.empty()) {
    out += n.host + ": " + partial + "\n";
    if (stream == 1) n.last_error_line = partial;
    partial.clear();
  }
  if (!out.empty()) writeAll(stream == 0 ? STDOUT_FILENO : STDERR_FILENO, out);
}

void say(const std::string& text) { writeAll(STDERR_FILENO, "cxxlaunch: " + text + "\n"); }

void tell(Node& n, const std::string& line) {
  if (n.in == -1) return;
  const std::string text = line + "\n";
  if (::write(n.in, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    // The remote shell is gone or not reading: its ssh goes next.
  }
}

std::string signalWord(int sig) {
  std::string name = signalName(sig);  // "SIGTERM"
  return name.starts_with("SIG") ? name.substr(3) : std::to_string(sig);
}

// fork + exec of ssh for `n`, its input, output and error through pipes. The child gets the
// default signal mask and dispositions back, its own process group (a Ctrl-C reaches the agents
// through us, in order, not as ssh dying), and dies with us (PR_SET_PDEATHSIG), which ends the
// remote shell's input and so the remote job.
void spawn(Node& n, const std::vector<std::string>& argv) {
  int in[2], out[2], err[2];
  CXXLAUNCH_SYSCALL(::pipe2(in, O_CLOEXEC));
  CXXLAUNCH_SYSCALL(::pipe2(out, O_CLOEXEC));
  CXXLAUNCH_SYSCALL(::pipe2(err, O_CLOEXEC));
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  CXXLAUNCH_SYSCALL(pid);
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(255);
    ::dup2(in[0], STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    ::execvp(args[0], args.data());
    const std::string why = "cannot run " + argv[0] + ": " + std::strerror(errno) + "\n";
    ssize_t ignored = ::write(STDERR_FILENO, why.data(), why.size());
    (void)ignored;
    ::_exit(255);
  }
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  n.pid = pid;
  n.running = true;
  n.in = in[1];
  n.fds[0] = out[0];
  n.fds[1] = err[0];
  for (int fd : {in[1], out[0], err[0]}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

}  // namespace

std::string shellQuote(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string remoteCommand(const RemoteLaunch& remote, size_t node) {
  const HostSlots& h = remote.hosts[node];
  std::vector<std::string> argv = {remote.launcher,
                                   "run",
                                   "--use_cluster_env=false",
                                   "--nnodes=" + std::to_string(remote.hosts.size()),
                                   "--node_rank=" + std::to_string(node),
                                   "--rdzv_backend=static",
                                   "--rdzv_endpoint=" + remote.endpoint,
                                   "--rdzv_id=" + remote.run_id};
  argv.insert(argv.end(), remote.flags.begin(), remote.flags.end());
  argv.push_back(std::string("--rdzv_conf=is_host=") + (node == 0 ? "1" : "0"));
  argv.push_back("--nproc_per_node=" + std::to_string(h.slots.size()));
  // Slots other than the first N name the devices.
  bool first_n = true;
  for (size_t i = 0; i < h.slots.size(); ++i)
    first_n = first_n && h.slots[i] == static_cast<int>(i);
  if (!first_n) {
    std::string ids;
    for (int s : h.slots) ids += (ids.empty() ? "" : ",") + std::to_string(s);
    argv.push_back("--gpus=" + ids);
  }
  argv.push_back("--");
  argv.insert(argv.end(), remote.command.begin(), remote.command.end());
  std::string exec = "exec env";
  for (const auto& [name, value] : remote.env) exec += " " + shellQuote(name + "=" + value);
  for (const auto& a : argv) exec += " " + shellQuote(a);
  // The reader beside the agent: named signals go to it ($$: the shell, then the agent it
  // becomes), the end of the input (ssh gone) sends SIGTERM.
  const std::string script =
      "cd " + shellQuote(remote.cwd) +
      " || exit 1\n"
      // An asynchronous list's input is /dev/null unless redirected: hence the copy on fd 3.
      "exec 3<&0\n"
      "( while read -r s; do kill -s \"$s\" $$; done; kill -s TERM $$ ) <&3 3<&- >/dev/null 2>&1 "
      "&\n" +
      exec + " </dev/null 3<&-\n";
  return "sh -c " + shellQuote(script);
}

//  1. One ssh per host, each running that host's node agent (remoteCommand).
//  2. Relay their output, whole lines prefixed "HOST: ".
//  3. A signal to us goes to every host as a line on its ssh's input; a stop signal (or the
//     first host that cannot be reached, or 15 s after the first that failed) starts the stop:
//     every other host is told TERM, and a host still running after its agents' shutdown grace
//     (+10 s to report) has its ssh stopped, which ends the remote input and so sends the agent
//     SIGTERM there. A second stop signal stops every ssh at once.
//  4. When every ssh has exited: name the first failure; its exit code is ours.
int runRemote(const LaunchOptions& options) {
  const RemoteLaunch& r = *options.remote;
  ::signal(SIGPIPE, SIG_IGN);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  for (int sig : kPassedOn) sigaddset(&mask, sig);
  CXXLAUNCH_SYSCALL(::sigprocmask(SIG_BLOCK, &mask, nullptr));
  const int signal_fd = ::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  CXXLAUNCH_SYSCALL(signal_fd);

  std::vector<Node> nodes(r.hosts.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    nodes[i].host = r.hosts[i].host;
    std::vector<std::string> argv = r.ssh;
    argv.insert(argv.end(), {"-o", "BatchMode=yes", r.hosts[i].host, remoteCommand(r, i)});
    spawn(nodes[i], argv);
  }
  say("started " + std::to_string(nodes.size()) + " node agents over ssh (run " + r.run_id +
      ", rendezvous " + r.endpoint + ")");

  std::optional<size_t> first_failure;
  int stop_signal = 0;
  bool stopping = false;
  std::optional<Clock::time_point> stop_all_at, stop_ssh_at, kill_ssh_at;
  const auto grace = options.shutdown_grace + kReportSlack;
  auto beginStop = [&](std::optional<size_t> except) {
    if (stopping) return;
    stopping = true;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (nodes[i].running && i != except) {
        tell(nodes[i], "TERM");
        nodes[i].told_to_stop = true;
      }
    }
    stop_ssh_at = Clock::now() + grace;
  };
  auto signalSsh = [&](int sig) {
    for (Node& n : nodes) {
      if (n.running) ::kill(-n.pid, sig);
    }
  };

  auto open = [&] {
    return std::any_of(nodes.begin(), nodes.end(),
                       [](const Node& n) { return n.running || n.fds[0] != -1 || n.fds[1] != -1; });
  };
  while (open()) {
    std::vector<pollfd> fds = {{signal_fd, POLLIN, 0}};
    std::vector<std::pair<size_t, int>> owners = {{0, -1}};
    for (size_t i = 0; i < nodes.size(); ++i) {
      for (int s = 0; s < 2; ++s) {
        if (nodes[i].fds[s] != -1) {
          fds.push_back({nodes[i].fds[s], POLLIN, 0});
          owners.emplace_back(i, s);
        }
      }
    }
    int timeout = -1;
    const auto now = Clock::now();
    for (const auto& at : {stop_all_at, stop_ssh_at, kill_ssh_at}) {
      if (!at) continue;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*at - now).count();
      timeout = std::max<int>(
          0, timeout == -1 ? static_cast<int>(left) : std::min(timeout, static_cast<int>(left)));
    }
    const int ready = ::poll(fds.data(), fds.size(), timeout);
    if (ready == -1 && errno != EINTR) throw SystemError("poll", errno);
    if (stop_all_at && Clock::now() >= *stop_all_at) {
      stop_all_at.reset();
      beginStop(std::nullopt);
    }
    if (stop_ssh_at && Clock::now() >= *stop_ssh_at) {
      stop_ssh_at.reset();
      signalSsh(SIGTERM);
      kill_ssh_at = Clock::now() + std::chrono::seconds(5);
    }
    if (kill_ssh_at && Clock::now() >= *kill_ssh_at) {
      kill_ssh_at.reset();
      signalSsh(SIGKILL);
    }
    if (ready <= 0) continue;
    for (size_t k = 1; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Node& n = nodes[owners[k].first];
      const int s = owners[k].second;
      char buffer[65536];
      const ssize_t got = ::read(n.fds[s], buffer, sizeof(buffer));
      if (got > 0) {
        relay(n, s, buffer, static_cast<size_t>(got), false);
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        relay(n, s, "", 0, true);
        ::close(n.fds[s]);
        n.fds[s] = -1;
      }
    }
    if (!(fds[0].revents & POLLIN)) continue;
    signalfd_siginfo info{};
    while (::read(signal_fd, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) {
        for (size_t i = 0; i < nodes.size(); ++i) {
          Node& n = nodes[i];
          int status = 0;
          if (!n.running || ::waitpid(n.pid, &status, WNOHANG) != n.pid) continue;
          n.running = false;
          n.ended = Clock::now();
          n.exit_code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
          if (n.in != -1) ::close(n.in);
          n.in = -1;
          if (n.exit_code != 0 && !first_failure && !stopping) {
            first_failure = i;
            if (n.exit_code == 255) {
              beginStop(i);  // never started, or lost: the others would wait for it
            } else {
              stop_all_at = Clock::now() + kFailureSettle;
            }
          }
        }
        while (::waitpid(-1, nullptr, WNOHANG) > 0) {
        }
      } else if (stopsJob(sig) && stopping && stop_signal != 0) {
        say("received " + signalName(sig) + " again: stopping every ssh now");
        signalSsh(SIGKILL);
      } else {
        const size_t live = static_cast<size_t>(
            std::count_if(nodes.begin(), nodes.end(), [](const Node& n) { return n.running; }));
        if (stopsJob(sig)) {
          say("received " + signalName(sig) + ", passing it on to " + std::to_string(live) +
              " hosts");
          if (stop_signal == 0) stop_signal = sig;
          stopping = true;
          stop_ssh_at = Clock::now() + grace;
        }
        for (Node& n : nodes) {
          if (!n.running) continue;
          tell(n, signalWord(sig));
          n.told_to_stop = n.told_to_stop || stopsJob(sig);
        }
      }
    }
  }
  ::close(signal_fd);

  std::string codes;
  for (const Node& n : nodes) {
    codes += (codes.empty() ? "" : ", ") + n.host + " " + std::to_string(n.exit_code) +
             (n.told_to_stop ? " (stopped)" : "");
  }
  if (first_failure) {
    const Node& n = nodes[*first_failure];
    if (n.exit_code == 255) {
      say("host " + n.host + " (node " + std::to_string(*first_failure) +
          ") could not be reached or refused the login (ssh exit 255): " +
          (n.last_error_line.empty() ? "ssh said nothing" : n.last_error_line) +
          "; the other hosts were stopped");
    } else {
      say("host " + n.host + " (node " + std::to_string(*first_failure) +
          ") failed first, with exit code " + std::to_string(n.exit_code) +
          (n.exit_code == 127 ? " (command not found there: is " + r.launcher +
                                    " installed at that path on " + n.host + "?)"
                              : ""));
    }
    say("exit codes: " + codes);
    return n.exit_code;
  }
  if (stop_signal != 0) {
    say("stopped by " + signalName(stop_signal) + "; exit codes: " + codes);
    return 128 + stop_signal;
  }
  for (const Node& n : nodes) {
    if (n.exit_code != 0) return n.exit_code;
  }
  return 0;
}

}  // namespace cxxlaunch::launcher
