// `cxxlaunch run` on a machine it shares with other local users: one who plants folders and
// symlinks where the launcher writes its logs or the trackers their files, and one whose process
// limit (ulimit -u) leaves the launcher no threads. The other user is uid 65534 (nobody); the
// tests need root to become it (CI runs as root): elsewhere the program exits 77 and ctest
// reports them as skipped.

#define CATCH_CONFIG_RUNNER
#include <grp.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "support/skip_main.h"
#include "support/subprocess.h"

using namespace cxxlaunch::testing;
using namespace std::chrono_literals;
using Args = std::vector<std::string>;
namespace fs = std::filesystem;

namespace {

constexpr uid_t kNobody = 65534;

// Runs `body` in a child process as uid and gid 65534; its return value is the exit code.
int asNobody(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) {
      ::_exit(100);
    }
    try {
      ::_exit(body());
    } catch (...) {
      ::_exit(101);  // never back into the test runner's copy in this child
    }
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A folder every user may write, as /tmp: the jobs' $TMPDIR.
struct SharedTmp {
  TempDir dir;
  SharedTmp() { fs::permissions(dir.path(), fs::perms::all | fs::perms::sticky_bit); }
  const std::string& path() const { return dir.path(); }
};

void writeText(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// What uid 65534 can read under `root` (symlinks followed) that contains `secret`; empty: none.
std::string readableByNobody(const std::string& root, const std::string& secret) {
  TempDir verdict;
  fs::permissions(verdict.path(), fs::perms::all);
  const std::string found = verdict.path() + "/found";
  asNobody([&] {
    auto options = fs::directory_options::skip_permission_denied;
    std::error_code ec;
    for (fs::recursive_directory_iterator it(root, options, ec), end; !ec && it != end;
         it.increment(ec)) {
      if (!it->is_regular_file(ec)) continue;
      std::ifstream in(it->path());
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (text.find(secret) != std::string::npos) writeText(found, it->path().string());
    }
    return 0;
  });
  return fs::exists(found) ? readFile(found) : "";
}

Args launch(const Args& flags, const std::string& secret) {
  Args argv = {CXXLAUNCH_BIN, "run", "--nproc_per_node=2"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), {TEST_WORKER, "print", secret, "eprint", secret});
  return argv;
}

}  // namespace

TEST_CASE("The default log folder is private: folders 0700, files 0600",
          "[launcher][integration][logs]") {
  TempDir tmp;
  auto r = run(launch({"--run_id=private"}, "hello"), {{"TMPDIR", tmp.path()}});
  REQUIRE(r.exit_code == 0);
  const fs::path base = tmp.path() + "/cxxlaunch-" + std::to_string(::geteuid());
  for (const auto& entry : fs::recursive_directory_iterator(base)) {
    struct stat st {};
    REQUIRE(::lstat(entry.path().c_str(), &st) == 0);
    INFO(entry.path());
    CHECK(st.st_uid == ::geteuid());
    if (entry.path().filename() == "heartbeat" || entry.path().filename() == "error.json") {
      continue;  // the worker's own files, in the worker's own 0700 folder
    }
    CHECK((st.st_mode & 07777) == (S_ISDIR(st.st_mode) ? 0700u : 0600u));
  }
  CHECK(fs::exists(base / "private/attempt_0/1/stdout.log"));
  CHECK(fs::exists(base / "private/run-summary.json"));
}

TEST_CASE("Another user's folders and symlinks in the default log base are not used",
          "[launcher][integration][logs]") {
  SharedTmp tmp;
  // Root's files that the planted symlink points at.
  const std::string victim = tmp.path() + "/victim";
  fs::create_directories(victim + "/attempt_0/0");
  writeText(victim + "/attempt_0/0/keep", "precious");
  writeText(victim + "/run-summary.json", "precious");
  // The other user takes the default base first: open to all, with a folder of theirs for
  // job-42 and a symlink to the victim for job-43.
  const std::string base = tmp.path() + "/cxxlaunch-" + std::to_string(::geteuid());
  REQUIRE(asNobody([&] {
            std::error_code ec;
            fs::create_directory(base, ec);
            fs::permissions(base, fs::perms::all, ec);
            fs::create_directory(base + "/job-42", ec);
            fs::permissions(base + "/job-42", fs::perms::all, ec);
            fs::create_directory_symlink(victim, base + "/job-43", ec);
            return ec ? 1 : 0;
          }) == 0);

  for (const std::string job : {"job-42", "job-43"}) {
    const std::string secret = "secret-of-" + job;
    auto r = run(launch({"--run_id=" + job}, secret), {{"TMPDIR", tmp.path()}});
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    // One note naming the refused base and the private folder used instead.
    CHECK(r.err.find("cxxlaunch: note: " + base + " is owned by uid 65534; the logs go to " + base +
                     "-") != std::string::npos);
    CHECK(readableByNobody(tmp.path(), secret).empty());
  }
  CHECK(readFile(victim + "/attempt_0/0/keep") == "precious");
  CHECK(readFile(victim + "/run-summary.json") == "precious");
  CHECK(fs::is_empty(base + "/job-42"));
}

TEST_CASE("A symlink planted below --log_dir is refused with one line and exit code 1",
          "[launcher][integration][logs]") {
  SharedTmp tmp;
  const std::string victim = tmp.path() + "/victim";
  fs::create_directories(victim);
  writeText(victim + "/run-summary.json", "precious");
  REQUIRE(asNobody([&] {
            std::error_code ec;
            fs::create_directory_symlink(victim, tmp.path() + "/job-44", ec);
            return ec ? 1 : 0;
          }) == 0);
  auto r = run(launch({"--run_id=job-44", "--log_dir", tmp.path()}, "secret"));
  CHECK(r.exit_code == 1);
  CHECK(r.err == "cxxlaunch run: the log folder " + tmp.path() +
                     "/job-44 is a symlink or not a folder: refusing to write logs there "
                     "(remove it, or choose --log_dir)\n");
  CHECK(readFile(victim + "/run-summary.json") == "precious");
  CHECK(std::distance(fs::directory_iterator(victim), fs::directory_iterator()) == 1);
}

TEST_CASE("Another user's project folder, or one they can write, is refused by the trackers",
          "[observability][integration][trackers]") {
  SharedTmp tmp;
  // Root's file, readable by root alone, that the other user wants a root job to write into.
  const std::string secret = tmp.path() + "/root-only";
  writeText(secret, "precious\n");
  fs::permissions(secret, fs::perms::owner_read | fs::perms::owner_write);
  // Theirs: runs/train/metrics.csv -> the file. Open to all: a symlink of theirs named train.
  const std::string theirs = tmp.path() + "/theirs", open = tmp.path() + "/open";
  fs::create_directory(open);
  fs::permissions(open, fs::perms::all);
  REQUIRE(asNobody([&] {
            std::error_code ec;
            fs::create_directories(theirs + "/train", ec);
            fs::create_symlink(secret, theirs + "/train/metrics.csv", ec);
            fs::create_directory_symlink(tmp.path(), open + "/train", ec);
            return ec ? 1 : 0;
          }) == 0);
  for (const auto& [project, why] :
       {std::pair<std::string, std::string>{theirs, "owned by uid 65534"},
        {open, "writable by others (mode 0777)"}}) {
    auto r = run(
        {CXXLAUNCH_BIN, "run", "--nproc_per_node=1", "--log_with", "csv", "--project_dir", project,
         TRAIN_BIN, "--model", "mlp", "--steps", "3", "--warmup", "1", "--run_name", "train"},
        {}, 120s);
    INFO(r.out << r.err);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains("the project folder '" + project + "' is " + why +
                                      ": refusing to write there"));
    CHECK(r.out.find("step ") == std::string::npos);  // refused before the first step
    CHECK(readFile(secret) == "precious\n");
    CHECK(!fs::exists(project + "/report.html"));
  }
}

TEST_CASE("Without threads or processes to be had (ulimit -u) the launcher says so and exits 1",
          "[launcher][integration][limits]") {
  SharedTmp tmp;
  // As uid 65534: root ignores RLIMIT_NPROC, which counts every process and thread of the user.
  for (const int limit : {1, 2, 6, 12}) {
    auto r = run({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                  "/usr/bin/prlimit", "--nproc=" + std::to_string(limit), "--", CXXLAUNCH_BIN,
                  "run", "--nproc_per_node=8", TEST_WORKER, "sleep", "1"},
                 {{"TMPDIR", tmp.path()}}, 30s);
    INFO("limit " << limit << ": " << r.err);
    CHECK(r.exit_code == 1);
    // On a machine with fewer than 8 cores a warning line says so first.
    std::string err = r.err;
    if (err.starts_with("cxxlaunch: warning: 8 worker processes on ")) {
      err.erase(0, err.find('\n') + 1);
    }
    CHECK(err.starts_with("cxxlaunch run: "));
    CHECK(err.ends_with(" (no thread or process could be started: this user may run " +
                        std::to_string(limit) + " at most, ulimit -u)\n"));
    CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  }
}

int main(int argc, char** argv) {
  return cxxlaunch::testing::runUnlessMissing(argc, argv, [] {
    return ::geteuid() == 0 ? std::string() : std::string("needs root, to act as uid 65534");
  });
}
