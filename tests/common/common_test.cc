// common/: host:port text, the atomic writer, the token reader and the command-line conventions.

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "common/atomic_file.h"
#include "common/command_line.h"
#include "common/error.h"
#include "common/file.h"
#include "common/host.h"
#include "support/page_cache.h"
#include "support/subprocess.h"

using namespace cxxlaunch;

TEST_CASE("host:port parses and formats, IPv6 in brackets", "[common][host]") {
  auto p = parseHostPort("node0:29500", 1);
  REQUIRE(p);
  CHECK(p->host == "node0");
  CHECK(p->port == 29500);
  CHECK(parseHostPort("node0", 29400)->port == 29400);
  CHECK(parseHostPort("[::1]:5000", 0)->host == "::1");
  CHECK(parseHostPort("[::1]", 7)->port == 7);
  for (const char* bad : {"", ":1", "h:", "h:0", "h:65536", "h:x", "[::1", "[::1]x", "[]:1"}) {
    INFO(bad);
    CHECK_FALSE(parseHostPort(bad, 29400));
  }
  CHECK(formatHostPort("node0", 1) == "node0:1");
  CHECK(formatHostPort("::1", 2) == "[::1]:2");
  CHECK(formatHostPort("fe80::1", "29400") == "[fe80::1]:29400");
  CHECK_FALSE(hostName().empty());
}

TEST_CASE("The interface that holds an address, and loopback addresses", "[common][host]") {
  CHECK(cxxlaunch::interfaceHolding("127.0.0.1") == "lo");
  CHECK(cxxlaunch::interfaceHolding("192.0.2.77").empty());  // TEST-NET-1: nobody's
  CHECK(cxxlaunch::interfaceHolding("not an address").empty());
  for (const char* a : {"127.0.0.1", "127.0.1.1", "127.255.0.3", "::1"}) {
    CHECK(cxxlaunch::isLoopbackAddress(a));
  }
  for (const char* a : {"10.0.0.1", "128.0.0.1", "::2", "localhost", ""}) {
    CHECK_FALSE(cxxlaunch::isLoopbackAddress(a));
  }
  const std::string other = cxxlaunch::firstNonLoopbackAddress();
  if (!other.empty()) {  // a machine with a network: the address is an interface's, not lo's
    CHECK_FALSE(cxxlaunch::isLoopbackAddress(other));
    CHECK_FALSE(cxxlaunch::interfaceHolding(other).empty());
    CHECK(cxxlaunch::interfaceHolding(other) != "lo");
  }
}

TEST_CASE("An atomic file is old or complete, and leaves no temporary behind", "[common][file]") {
  testing::TempDir dir;
  const std::string path = dir.path() + "/a.json";
  writeFileAtomically(path, "one\n");
  writeFileAtomically(path, "two\n");
  CHECK(testing::readFile(path) == "two\n");
  // Without the fsyncs (a report): renamed into place all the same.
  writeFileAtomically(path, "two, again\n", Durability::kProcessCrash);
  CHECK(testing::readFile(path) == "two, again\n");
  writeFileAtomically(path, "two\n");
  {
    AtomicFile abandoned(path);
    abandoned.append("three", 5);
  }  // destroyed uncommitted: the old content stays
  CHECK(testing::readFile(path) == "two\n");
  size_t entries = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    (void)entry;
    ++entries;
  }
  CHECK(entries == 1);
  REQUIRE_THROWS_AS(writeFileAtomically(dir.path() + "/no/such/dir/x", "x"), SystemError);
}

TEST_CASE("An atomic file written past the page cache holds exactly what was appended",
          "[common][file]") {
  // Pieces that cross the 8 MiB buffers (more of them than the two: each written behind the
  // next one's filling) and the 4 KiB alignment everywhere, then a short tail; on the disk's
  // file system (O_DIRECT) and on tmpfs (which may refuse it: the page cache).
  std::string expected;
  std::vector<size_t> pieces = {
      1, 4095, 4097, (size_t{5} << 20) + 3, size_t{9} << 20, 17, 0, (size_t{20} << 20) + 5, 3};
  testing::TempDir disk;
  std::vector<std::string> folders = {disk.path()};
  if (std::filesystem::is_directory("/dev/shm")) folders.push_back("/dev/shm");
  for (const std::string& folder : folders) {
    INFO(folder);
    const std::string path = folder + "/cxxlaunch-direct-" + std::to_string(::getpid()) + ".bin";
    AtomicFile file(path, Durability::kPowerLoss, Writes::kPastPageCache);
    expected.clear();
    for (size_t k = 0; k < pieces.size(); ++k) {
      std::string piece(pieces[k], '\0');
      for (size_t i = 0; i < piece.size(); ++i) piece[i] = static_cast<char>(i * 7 + k * 131);
      file.append(piece.data(), piece.size());
      expected += piece;
    }
    file.commit();
    if (testing::takesDirectIo(folder)) {  // then none of it went through the page cache
      CHECK(testing::residentPages(path) == 0);
    }
    const std::string written = testing::readFile(path);
    CHECK(written.size() == expected.size());
    CHECK(written == expected);
    std::filesystem::remove(path);
  }
  // Nothing at all, and less than one block.
  for (const std::string& content : {std::string(), std::string("tail")}) {
    const std::string path = disk.path() + "/small.bin";
    AtomicFile file(path, Durability::kPowerLoss, Writes::kPastPageCache);
    file.append(content.data(), content.size());
    file.commit();
    CHECK(testing::readFile(path) == content);
  }
  {
    AtomicFile abandoned(disk.path() + "/small.bin", Durability::kPowerLoss,
                         Writes::kPastPageCache);
    abandoned.append("three", 5);
  }  // destroyed uncommitted: the old content stays, no temporary is left
  CHECK(testing::readFile(disk.path() + "/small.bin") == "tail");
  CHECK(std::distance(std::filesystem::directory_iterator(disk.path()),
                      std::filesystem::directory_iterator()) == 1);
}

TEST_CASE("A write that fails behind the caller is an error, and nothing is renamed into place",
          "[common][file]") {
  testing::TempDir disk;
  const std::string path = disk.path() + "/big.bin";
  // A child limited to files of 8 MiB: past the page cache, the second buffer's write fails
  // (EFBIG) on the writing thread while the child appends the third; through it (a file system
  // that refuses O_DIRECT), the write that crosses the limit fails in append().
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{size_t{8} << 20, size_t{8} << 20};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(3);
    const std::vector<char> piece(size_t{1} << 20, 'x');
    try {
      AtomicFile file(path, Durability::kPowerLoss, Writes::kPastPageCache);
      for (int i = 0; i < 40; ++i) file.append(piece.data(), piece.size());
      file.commit();
    } catch (const SystemError& e) {
      const std::string what = e.what();
      ::_exit(what.find("writing") != std::string::npos && what.find(path) != std::string::npos
                  ? 0
                  : 4);
    }
    ::_exit(1);  // committed past the limit
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  // The temporary file went with the error, and the final name was never written.
  CHECK(std::filesystem::is_empty(disk.path()));
}

TEST_CASE("A token file gives its first line, and an empty one is refused", "[common][file]") {
  testing::TempDir dir;
  std::ofstream(dir.path() + "/token") << "s3cret\nrest\n";
  CHECK(readTokenFile(dir.path() + "/token", "--token-file") == "s3cret");
  std::ofstream(dir.path() + "/empty") << "\n";
  REQUIRE_THROWS_WITH(readTokenFile(dir.path() + "/empty", "--token-file"),
                      Catch::Contains("has no token"));
  REQUIRE_THROWS_WITH(readTokenFile("/dev/zero", "--token-file"),
                      Catch::Contains("not a regular file"));
}

TEST_CASE("openRegularFile opens a regular file, and refuses FIFOs, folders and big files at once",
          "[common][file]") {
  testing::TempDir dir;
  const std::string path = dir.path() + "/data";
  std::ofstream(path) << "twelve bytes";
  const OpenFile file = openRegularFile(path, "--data", 12);
  CHECK(file.size() == 12);
  char bytes[16] = {};
  CHECK(::read(file.fd(), bytes, sizeof(bytes)) == 12);
  CHECK(std::string(bytes) == "twelve bytes");
  REQUIRE_THROWS_WITH(openRegularFile(path, "--data", 11),
                      "--data '" + path + "': is 12 bytes, more than the 11 such a file may have");
  const std::string fifo = dir.path() + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  REQUIRE_THROWS_WITH(
      openRegularFile(fifo, "tokenizer.json"),
      "tokenizer.json '" + fifo + "': is not a regular file (a FIFO, socket or device)");
  REQUIRE_THROWS_WITH(openRegularFile(dir.path(), "config"),
                      "config '" + dir.path() + "': is a directory, not a file");
  const std::string loop = dir.path() + "/loop";
  std::filesystem::create_symlink(loop, loop);
  REQUIRE_THROWS_WITH(openRegularFile(loop, "--model_dir"),
                      Catch::Contains("cannot open it: Too many levels of symbolic links"));
  // The descriptor is handed over, or closed with the object.
  int fd = -1;
  {
    OpenFile moved = openRegularFile(path, "--data");
    OpenFile owner(std::move(moved));
    CHECK(moved.fd() == -1);
    fd = owner.fd();
    CHECK(::fcntl(fd, F_GETFD) != -1);
  }
  CHECK(::fcntl(fd, F_GETFD) == -1);
}

TEST_CASE("Command lines: both spellings, both value forms, one-line errors", "[common][cli]") {
  auto parse = [](const std::vector<std::string>& args) {
    CLI::App app("test", "prog");
    cli::useConventions(app);
    int steps = 0;
    bool check = false;
    app.add_option(cli::spellings("max_steps"), steps, "steps");
    app.add_flag(cli::spellings("check"), check, "check")->disable_flag_override();
    cli::parse(app, args);
    return std::make_pair(steps, check);
  };
  CHECK(parse({"--max_steps=3"}).first == 3);
  CHECK(parse({"--max-steps", "4"}).first == 4);
  CHECK(parse({"--max-steps", "4", "--max_steps=5"}).first == 5);
  CHECK(parse({"--check"}).second);
  CHECK(cli::spellings("token-file,r") == "--token-file,--token_file,-r");
  REQUIRE_THROWS_WITH(parse({"--max_step=3"}),
                      "unknown flag '--max_step=3'; did you mean --max_steps? (see prog --help)");
  REQUIRE_THROWS_WITH(parse({"--max_steps"}), "--max_steps needs a value");
  REQUIRE_THROWS_WITH(parse({"--max_steps=x"}), "--max_steps: 'x' is not a valid value");
  REQUIRE_THROWS_WITH(parse({"--check=1"}), "--check takes no value");
  REQUIRE_THROWS_WITH(parse({"stray"}), "unexpected argument 'stray' (see prog --help)");
  REQUIRE_THROWS_AS(parse({"--help"}), cli::HelpRequested);
}
