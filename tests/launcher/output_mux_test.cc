#include "launcher/output_mux.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

#include "support/subprocess.h"

using namespace cxxlaunch::launcher;
using cxxlaunch::testing::readFile;
using cxxlaunch::testing::TempDir;

namespace {

// A worker's pipe: the mux reads `read_end`, the test writes as the worker would.
struct WorkerPipe {
  WorkerPipe() {
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0);
    read_end = fds[0];
    write_end = fds[1];
  }
  ~WorkerPipe() { closeWriter(); }
  void write(const std::string& text) const {
    REQUIRE(::write(write_end, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
  }
  void closeWriter() {
    if (write_end != -1) ::close(write_end);
    write_end = -1;
  }
  int read_end = -1;  // the mux's once added
  int write_end = -1;
};

// A console the test reads when it chooses: a pipe.
struct ConsolePipe {
  ConsolePipe() {
    int fds[2];
    REQUIRE(::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0);
    read_end = fds[0];
    console = std::make_unique<Console>(fds[1]);
  }
  ~ConsolePipe() {
    ::close(read_end);
    ::close(console->fd());
  }
  std::string read() const {
    std::string out;
    char buffer[65536];
    ssize_t n;
    while ((n = ::read(read_end, buffer, sizeof(buffer))) > 0) out.append(buffer, n);
    return out;
  }
  int read_end = -1;
  std::unique_ptr<Console> console;
};

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

}  // namespace

TEST_CASE(
    "The mux's fd wakes the loop for output, every byte reaches the log and whole lines the "
    "console",
    "[output_mux]") {
  TempDir dir;
  ConsolePipe screen;
  OutputMux mux({screen.console.get()});
  WorkerPipe out, err;
  CHECK(mux.add(out.read_end, std::make_unique<StreamSink>(
                                  dir.path() + "/0.out", screen.console.get(), "[rank 0]: ", 0)) ==
        0);
  CHECK(mux.add(err.read_end, std::make_unique<StreamSink>(dir.path() + "/0.err", nullptr,
                                                           "[rank 0]: ", 2)) == 1);
  CHECK_FALSE(readable(mux.fd()));
  out.write("hello\nhalf a l");
  err.write("e1\ne2\ne3\n");
  CHECK(readable(mux.fd()));
  mux.service();
  CHECK_FALSE(readable(mux.fd()));
  CHECK(screen.read() == "[rank 0]: hello\n");
  CHECK(mux.tail(1) == std::vector<std::string>{"e2", "e3"});
  out.write("ine");
  out.closeWriter();
  err.closeWriter();
  mux.closeAll();  // the last line without its newline is ended
  CHECK(screen.read() == "[rank 0]: half a line\n");
  CHECK(readFile(dir.path() + "/0.out") == "hello\nhalf a line");
  CHECK(readFile(dir.path() + "/0.err") == "e1\ne2\ne3\n");
}

TEST_CASE(
    "A full console stops its streams being read until half of it is written, losing no "
    "byte",
    "[output_mux]") {
  TempDir dir;
  ConsolePipe screen;  // not read for now
  OutputMux mux({screen.console.get()});
  WorkerPipe loud, quiet;
  mux.add(loud.read_end,
          std::make_unique<StreamSink>(dir.path() + "/loud.log", screen.console.get(), "", 0));
  mux.add(quiet.read_end, std::make_unique<StreamSink>(dir.path() + "/quiet.log", nullptr, "", 0));
  const std::string line(1023, 'x');
  size_t sent = 0;
  // Feed the console past full: a pipe's worth at a time, each read by the mux.
  while (!screen.console->full()) {
    while (::write(loud.write_end, (line + "\n").data(), 1024) == 1024) sent += 1024;
    mux.service();
  }
  // Full: the loud worker's pipe is out of the set (its writer would block), the other stream
  // is still read.
  while (::write(loud.write_end, (line + "\n").data(), 1024) == 1024) sent += 1024;
  quiet.write("still heard\n");
  mux.service();
  CHECK(readFile(dir.path() + "/quiet.log") == "still heard\n");
  CHECK(readable(loud.read_end));
  CHECK_FALSE(readable(mux.fd()));  // nothing it may read, and the console has no room
  // The reader comes back: the console has room, the stream is read again, every line arrives.
  std::string seen;
  while (seen.size() < sent) {
    seen += screen.read();
    if (readable(mux.fd())) mux.service();
  }
  CHECK(seen.size() == sent);
  CHECK(seen.substr(0, 1024) == line + "\n");
  CHECK(readFile(dir.path() + "/loud.log").size() == sent);
}

TEST_CASE("A dead worker's last words are read whatever its console's queue", "[output_mux]") {
  TempDir dir;
  ConsolePipe screen;
  OutputMux mux({screen.console.get()});
  WorkerPipe err;
  mux.add(err.read_end,
          std::make_unique<StreamSink>(dir.path() + "/err.log", screen.console.get(), "", 3));
  while (!screen.console->full()) screen.console->write(std::string(4096, 'q') + "\n");
  err.write("Traceback\nRuntimeError: boom\n");
  mux.service();
  CHECK(mux.tail(0).empty());  // its share waits for the console
  mux.readLastWords(0);
  CHECK(mux.tail(0) == std::vector<std::string>{"Traceback", "RuntimeError: boom"});
}

TEST_CASE("Clearing the mux closes the streams and numbers the next attempt's from 0",
          "[output_mux]") {
  TempDir dir;
  OutputMux mux(std::vector<Console*>{});
  WorkerPipe first;
  mux.add(first.read_end, std::make_unique<StreamSink>(dir.path() + "/a.log", nullptr, "", 0));
  first.write("before the restart\n");
  mux.clear();
  CHECK(readFile(dir.path() + "/a.log") == "before the restart\n");
  CHECK(::fcntl(first.read_end, F_GETFD) == -1);  // closed
  WorkerPipe second;
  CHECK(mux.add(second.read_end,
                std::make_unique<StreamSink>(dir.path() + "/b.log", nullptr, "", 0)) == 0);
  CHECK(mux.size() == 1);
}
