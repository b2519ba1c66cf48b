// The heartbeat's cost per micro-step (runtime/heartbeat.h), against the touch it replaced
// (futimens) measured in the same run on the same file system:
//   touch    futimens of the file: the heartbeat before it carried a record
//   record   formatting the progress record and pwrite-ing it over the file (what a beat does
//            at most every 100 ms once steps are done)
//   beat     Heartbeat::beat() between two writes (what nearly every micro-step pays)
//   step     Heartbeat::stepDone() (once per optimizer step: the step time window)
//
//   heartbeat_cost_bench [--dir DIR] [--calls N]     (default: $TMPDIR, 200000 calls)

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/heartbeat_record.h"
#include "runtime/heartbeat.h"

using Clock = std::chrono::steady_clock;

template <typename F>
double nanosPerCall(int64_t calls, F&& f) {
  const auto start = Clock::now();
  for (int64_t i = 0; i < calls; ++i) f(i);
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count() /
         static_cast<double>(calls);
}

int main(int argc, char** argv) {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = tmp != nullptr ? tmp : "/tmp";
  int64_t calls = 200000;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--dir") == 0) dir = argv[++i];
    if (std::strcmp(argv[i], "--calls") == 0) calls = std::atoll(argv[++i]);
  }
  const std::string path = dir + "/heartbeat_cost_bench." + std::to_string(::getpid());
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd == -1) {
    std::perror(("open " + path).c_str());
    return 1;
  }
  const double touch = nanosPerCall(calls, [&](int64_t) { ::futimens(fd, nullptr); });
  cxxlaunch::HeartbeatRecord r;
  r.total = calls;
  r.step_us = 52000;
  r.work_us = 31000;
  const double record = nanosPerCall(calls, [&](int64_t i) {
    r.steps = i;
    r.loss = 1.0 / static_cast<double>(i + 1);
    const std::string line = cxxlaunch::formatHeartbeatRecord(r);
    if (::pwrite(fd, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size()))
      std::abort();
  });
  ::close(fd);
  double beat = 0, step = 0;
  {
    cxxlaunch::runtime::Heartbeat heartbeat(path);
    heartbeat.setTotalSteps(0);
    heartbeat.beat();
    beat = nanosPerCall(calls, [&](int64_t) { heartbeat.beat(); });
    step = nanosPerCall(calls,
                        [&](int64_t i) { heartbeat.stepDone(i + 1, std::chrono::nanoseconds(i)); });
  }
  ::unlink(path.c_str());
  std::printf("heartbeat cost on %s, %lld calls each (peer: futimens, the touch before records)\n",
              dir.c_str(), static_cast<long long>(calls));
  std::printf("%-8s %12s %14s\n", "what", "ns/call", "x futimens");
  for (auto [name, ns] : {std::pair{"touch", touch}, std::pair{"record", record},
                          std::pair{"beat", beat}, std::pair{"step", step}}) {
    std::printf("%-8s %12.1f %14.2f\n", name, ns, ns / touch);
  }
  return 0;
}
