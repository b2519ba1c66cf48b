// cxxlaunch_test_worker: a worker whose behaviour the test spells out as a list of steps.
//
//   print TEXT | eprint TEXT | partial TEXT   line to stdout / line to stderr / stdout, no newline
//   env                                       print every contract variable as NAME=value
//   argv                                      print each argument after "argv", one per line
//   sleep SECONDS | exit CODE | kill SIGNAL   (SIGNAL by number)
//   trap                                      report forwarded signals as "got SIGNAME";
//                                             INT/TERM/HUP/QUIT then exit with 128+signal
//   ignore-term                               ignore SIGTERM
//   wait                                      sleep until a signal ends the process
//   wait-file PATH                            sleep until PATH exists
//   pidfile DIR                               write DIR/rank<RANK>.pid
//   error-file TEXT                           write TORCHELASTIC_ERROR_FILE as torchelastic does
//   heartbeat                                 touch CXXLAUNCH_HEARTBEAT_FILE, as the runtime does
//   beating                                   touch it every 0.1 s until a signal ends the process
//   rank R | rank all                         following steps only on global rank R (or all)
//   attempt-below K                           following steps only while restart count < K
//
// Steps run in order; the program exits 0 after the last one.

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

namespace {

int envInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : fallback;
}

void onSignal(int sig) {
  char line[64];
  const char* abbrev = sigabbrev_np(sig);
  int n = 0;
  const char prefix[] = "got SIG";
  std::memcpy(line, prefix, sizeof(prefix) - 1);
  n = sizeof(prefix) - 1;
  for (const char* c = abbrev; c != nullptr && *c != '\0' && n < 60; ++c) line[n++] = *c;
  line[n++] = '\n';
  ssize_t ignored = ::write(STDOUT_FILENO, line, static_cast<size_t>(n));
  (void)ignored;
  if (sig != SIGUSR1 && sig != SIGUSR2) ::_exit(128 + sig);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> steps(argv + 1, argv + argc);
  const int rank = envInt("RANK", 0);
  const int attempt = envInt("TORCHELASTIC_RESTART_COUNT", 0);
  int only_rank = -1;
  int attempt_below = -1;
  auto need = [&](size_t& i) -> const std::string& {
    if (i + 1 >= steps.size()) {
      std::cerr << "test_worker: step '" << steps[i] << "' needs an argument\n";
      std::exit(100);
    }
    return steps[++i];
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string step = steps[i];
    if (step == "rank") {
      const std::string& r = need(i);
      only_rank = r == "all" ? -1 : std::atoi(r.c_str());
      continue;
    }
    if (step == "attempt-below") {
      attempt_below = std::atoi(need(i).c_str());
      continue;
    }
    if (step == "argv") {
      for (size_t j = i + 1; j < steps.size(); ++j) std::cout << steps[j] << "\n";
      break;
    }
    const bool active =
        (only_rank < 0 || only_rank == rank) && (attempt_below < 0 || attempt < attempt_below);
    const bool takes_arg = step != "env" && step != "trap" && step != "ignore-term" &&
                           step != "wait" && step != "heartbeat" && step != "beating";
    const std::string arg = takes_arg ? need(i) : "";
    if (!active) continue;
    if (step == "print") {
      std::cout << arg << std::endl;
    } else if (step == "eprint") {
      std::cerr << arg << std::endl;
    } else if (step == "partial") {
      std::cout << arg << std::flush;
    } else if (step == "env") {
      for (const char* name : {"RANK",
                               "LOCAL_RANK",
                               "WORLD_SIZE",
                               "LOCAL_WORLD_SIZE",
                               "GROUP_RANK",
                               "GROUP_WORLD_SIZE",
                               "ROLE_NAME",
                               "ROLE_RANK",
                               "ROLE_WORLD_SIZE",
                               "MASTER_ADDR",
                               "MASTER_PORT",
                               "TORCHELASTIC_RESTART_COUNT",
                               "TORCHELASTIC_MAX_RESTARTS",
                               "TORCHELASTIC_RUN_ID",
                               "TORCHELASTIC_ERROR_FILE",
                               "OMP_NUM_THREADS",
                               "CXXLAUNCH_DEVICE",
                               "CUDA_VISIBLE_DEVICES",
                               "CXXLAUNCH_STORE_ENDPOINT",
                               "CXXLAUNCH_STORE_PREFIX"}) {
        const char* v = std::getenv(name);
        if (v != nullptr) std::cout << name << "=" << v << "\n";
      }
      std::cout << std::flush;
    } else if (step == "heartbeat") {
      const char* file = std::getenv("CXXLAUNCH_HEARTBEAT_FILE");
      if (file != nullptr) std::ofstream(file, std::ios::trunc).flush();
    } else if (step == "beating") {
      const char* file = std::getenv("CXXLAUNCH_HEARTBEAT_FILE");
      for (;;) {
        if (file != nullptr) std::ofstream(file, std::ios::trunc).flush();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    } else if (step == "sleep") {
      std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(arg.c_str())));
    } else if (step == "exit") {
      std::cout << std::flush;
      std::exit(std::atoi(arg.c_str()));
    } else if (step == "kill") {
      std::cout << std::flush;
      ::raise(std::atoi(arg.c_str()));
    } else if (step == "trap") {
      for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) ::signal(sig, onSignal);
    } else if (step == "ignore-term") {
      ::signal(SIGTERM, SIG_IGN);
    } else if (step == "wait") {
      for (;;) ::pause();
    } else if (step == "wait-file") {
      while (::access(arg.c_str(), F_OK) != 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    } else if (step == "pidfile") {
      const std::string path = arg + "/rank" + std::to_string(rank) + ".pid";
      const std::string tmp = path + ".tmp";
      std::ofstream(tmp) << ::getpid() << "\n";
      std::rename(tmp.c_str(), path.c_str());
    } else if (step == "error-file") {
      const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
      if (path != nullptr) {
        std::ofstream(path) << R"({"message": {"message": ")" << arg
                            << R"(", "extraInfo": {"timestamp": ")" << std::time(nullptr)
                            << R"("}}})";
      }
    } else {
      std::cerr << "test_worker: unknown step '" << step << "'\n";
      return 100;
    }
  }
  return 0;
}
