// report.html in a real browser: the example trainer writes a report under `cxxlaunch run`,
// Debian's headless Chromium renders it to a PNG, and check_screenshot.py finds a page that is
// not blank and the plots' lines in its pixels. No Chromium, or one that cannot start, is a
// failure that says so (this test's label, `browser`, is there to leave it out knowingly).

#include <unistd.h>

#include <catch2/catch.hpp>

#include "support/subprocess.h"

using namespace cxxlaunch::testing;
using namespace std::chrono_literals;

namespace {

std::string chromium() {
  for (const char* path :
       {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/chromium-headless-shell"}) {
    if (::access(path, X_OK) == 0) return path;
  }
  return "";
}

}  // namespace

TEST_CASE("report.html renders in headless Chromium with its plots", "[observability][browser]") {
  const std::string browser = chromium();
  INFO(
      "no Chromium: install Debian's chromium (scripts/setup.sh does), or leave this test out "
      "with ctest -LE browser");
  REQUIRE(!browser.empty());
  TempDir dir;
  const std::string project = dir.path() + "/project";
  auto r = run({CXXLAUNCH_BIN, "run", "--nproc_per_node", "2", "--log_with", "csv", "--project_dir",
                project, TRAIN_BIN, "--model", "mlp", "--steps", "12", "--warmup", "2"},
               {}, 240s);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const std::string png = dir.path() + "/report.png";
  // --no-sandbox: the page is our own local file, and the sandbox cannot start as root or in
  // most containers. No network is needed: the page fetches nothing.
  auto shot =
      run({browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--no-first-run", "--user-data-dir=" + dir.path() + "/profile",
           "--window-size=1100,1400", "--screenshot=" + png, "file://" + project + "/report.html"},
          {}, 120s);
  INFO("chromium: exit " << shot.exit_code << "\n" << shot.out << shot.err);
  REQUIRE(shot.exit_code == 0);
  auto check = run({"/usr/bin/python3", CHECK_SCREENSHOT_PY, png, "2000"});
  INFO("check_screenshot.py: " << check.out << check.err);
  CHECK(check.exit_code == 0);
}
