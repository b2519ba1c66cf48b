#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "launcher/output.h"
#include "support/subprocess.h"

using namespace cxxlaunch::launcher;
using cxxlaunch::testing::readFile;
using cxxlaunch::testing::TempDir;

namespace {
// A file standing in for the console; drain() returns what was written since the last call.
struct Console {
  Console() : path(dir.path() + "/console") {
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    REQUIRE(fd != -1);
  }
  ~Console() { ::close(fd); }
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
  Console console;
  const std::string log = dir.path() + "/stdout.log";
  {
    StreamSink sink(log, console.fd, "[rank 1]: ", 2);
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
  Console console;
  StreamSink quiet(dir.path() + "/q.log", -1, "[rank 0]: ", 0);
  quiet.write("x\n");
  REQUIRE(readFile(dir.path() + "/q.log") == "x\n");

  StreamSink loud(dir.path() + "/l.log", console.fd, "", 0);
  loud.write(std::string(StreamSink::kMaxLine + 10, 'z'));
  std::string out = console.drain();
  REQUIRE(out == std::string(StreamSink::kMaxLine, 'z') + "\n");
}

TEST_CASE("StreamSink reports a log file it cannot create", "[output]") {
  REQUIRE_THROWS_WITH(StreamSink("/no/such/dir/x.log", -1, "", 0),
                      Catch::Contains("open /no/such/dir/x.log"));
}
