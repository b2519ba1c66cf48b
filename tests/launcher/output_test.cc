#include "launcher/output.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <thread>

#include "support/subprocess.h"

using namespace cxxlaunch::launcher;
using cxxlaunch::testing::readFile;
using cxxlaunch::testing::TempDir;

namespace {
// A file standing in for the console; drain() returns what was written since the last call.
struct ConsoleFile {
  ConsoleFile() : path(dir.path() + "/console") {
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    REQUIRE(fd != -1);
  }
  ~ConsoleFile() { ::close(fd); }
  std::string drain() {
    std::string all = readFile(path);
    std::string fresh = all.substr(seen);
    seen = all.size();
    return fresh;
  }
  TempDir dir;
  std::string path;
  int fd = -1;
  size_t seen = 0;
};
}  // namespace

TEST_CASE("StreamSink writes raw bytes to the log and whole prefixed lines to the console",
          "[output]") {
  TempDir dir;
  ConsoleFile console;
  const std::string log = dir.path() + "/stdout.log";
  {
    Console out(console.fd);
    StreamSink sink(log, &out, "[rank 1]: ", 2);
    sink.write("hel");
    REQUIRE(console.drain().empty());  // half a line waits for its end
    sink.write("lo\nwor");
    REQUIRE(console.drain() == "[rank 1]: hello\n");
    sink.write("ld\na\nb\n");
    REQUIRE(sink.tail() == std::vector<std::string>{"a", "b"});
    sink.write("no newline");
    sink.finish();
    REQUIRE(console.drain() == "[rank 1]: world\n[rank 1]: a\n[rank 1]: b\n[rank 1]: no newline\n");
  }
  REQUIRE(readFile(log) == "hello\nworld\na\nb\nno newline");
}

TEST_CASE("StreamSink without a console only logs, and splits endless lines", "[output]") {
  TempDir dir;
  ConsoleFile console;
  StreamSink quiet(dir.path() + "/q.log", nullptr, "[rank 0]: ", 0);
  quiet.write("x\n");
  REQUIRE(readFile(dir.path() + "/q.log") == "x\n");

  Console screen(console.fd);
  StreamSink loud(dir.path() + "/l.log", &screen, "", 0);
  loud.write(std::string(StreamSink::kMaxLine + 10, 'z'));
  std::string out = console.drain();
  REQUIRE(out == std::string(StreamSink::kMaxLine, 'z') + "\n");
}

TEST_CASE("StreamSink reports a log file it cannot create", "[output]") {
  REQUIRE_THROWS_WITH(StreamSink("/no/such/dir/x.log", nullptr, "", 0),
                      Catch::Contains("open /no/such/dir/x.log"));
}

TEST_CASE("A console that is not read queues lines without blocking, then takes them all",
          "[output]") {
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  Console console(pipe_fds[1]);
  TempDir dir;
  StreamSink sink(dir.path() + "/out.log", &console, "[rank 0]: ", 0);
  const std::string line(999, 'y');  // 1000 bytes per line with its newline, 1010 prefixed
  const auto start = std::chrono::steady_clock::now();
  size_t written = 0;
  while (!console.full()) {  // what the agent does: stop feeding a full console
    sink.write(line + "\n");
    written += 1000;
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(2));  // never blocked
  CHECK(console.pending() > Console::kMaxPending);
  CHECK(readFile(dir.path() + "/out.log").size() == written);  // the log has every byte
  // A reader comes: every queued line arrives whole.
  std::string got;
  std::thread reader([&] {
    char buffer[65536];
    ssize_t n;
    while ((n = ::read(pipe_fds[0], buffer, sizeof(buffer))) > 0) got.append(buffer, n);
  });
  CHECK(console.drain(std::chrono::seconds(10)));
  ::close(pipe_fds[1]);
  reader.join();
  ::close(pipe_fds[0]);
  CHECK(got.size() == written / 1000 * 1010);
  CHECK(got.substr(0, 1010) == "[rank 0]: " + line + "\n");
}

TEST_CASE("A console whose reader is gone drops its lines instead of failing", "[output]") {
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  ::close(pipe_fds[0]);
  auto previous = std::signal(SIGPIPE, SIG_IGN);  // as the agent does
  Console console(pipe_fds[1]);
  console.write("nobody reads this\n");  // EPIPE
  CHECK(console.pending() == 0);
  CHECK(console.drain(std::chrono::milliseconds(10)));
  ::close(pipe_fds[1]);
  std::signal(SIGPIPE, previous);
}
