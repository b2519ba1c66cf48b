// The trackers of runtime/observability: TensorBoard event files read back by an independent
// reader (read_tfevents.py: its own CRC-32C and wire decoding, and Protobuf's Python parser over
// tensorflow's field numbers), CSV and JSON lines with the same values, the report's content, and
// the errors a user meets.

#include "runtime/observability/trackers.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/host.h"
#include "common/tracker_names.h"
#include "common/utf8.h"
#include "runtime/observability/event_file.h"
#include "runtime/observability/report.h"
#include "support/subprocess.h"
#include "support/text_lines.h"

using cxxlaunch::testing::lines;

using cxxlaunch::InvalidArgument;
using cxxlaunch::testing::readFile;
using cxxlaunch::testing::run;
using cxxlaunch::testing::TempDir;
namespace rt = cxxlaunch::runtime;

namespace {

std::vector<std::string> filesIn(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    closedir(d);
  }
  return names;
}

std::string eventFileIn(const std::string& dir) {
  for (const auto& name : filesIn(dir)) {
    if (name.rfind("events.out.tfevents.", 0) == 0) return dir + "/" + name;
  }
  return "";
}

// Values whose float and decimal forms are exact, so every file must hold them to the digit.
double lossAt(int step) { return 4.0 - step * 0.25; }
double lrAt(int step) { return step * 0.125; }

}  // namespace

TEST_CASE("TFRecord framing uses the masked CRC-32C of TensorFlow's records", "[trackers]") {
  // CRC-32C("123456789") = 0xE3069283 (the check value of the Castagnoli CRC); masked as
  // TensorFlow's crc32c::Mask: rotate right by 15, add 0xa282ead8.
  const uint32_t crc = 0xE3069283u;
  CHECK(rt::maskedCrc32c("123456789") == ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
  const auto record = rt::tfRecord("abc");
  REQUIRE(record.size() == 8 + 4 + 3 + 4);
  CHECK(static_cast<unsigned char>(record[0]) == 3);
  CHECK(record.substr(12, 3) == "abc");
}

TEST_CASE("Every tracker writes the same values, and TensorBoard's format is read back",
          "[trackers]") {
  TempDir tmp;
  const std::string project = tmp.path() + "/project";
  {
    rt::Trackers trackers(
        {cxxlaunch::parseTrackerList("tensorboard,csv,jsonl", "test"), project, "run1", 4},
        {{"lr", 0.001}, {"model", "gpt"}, {"layers", 12}, {"bf16", true}}, {{"world size", 2}});
    for (int step = 0; step < 10; ++step) {
      trackers.log({{"loss", lossAt(step)}, {"lr", lrAt(step)}}, step);
    }
    trackers.log({{"eval/accuracy", 0.75}}, 10);
  }
  const std::string dir = project + "/run1";

  const auto event_file = eventFileIn(dir);
  REQUIRE(!event_file.empty());
  const auto name = event_file.substr(event_file.rfind('/') + 1);
  CHECK(name.find(cxxlaunch::hostName()) != std::string::npos);
  const auto read = run({"/usr/bin/python3", READ_TFEVENTS_PY, event_file});
  INFO(read.err);
  REQUIRE(read.exit_code == 0);
  const auto tb = lines(read.out);
  REQUIRE(tb.size() == 2 + 21);
  // Both decoders ran: the hand-written one and Protobuf's (Debian's python3-protobuf, which
  // scripts/setup.sh installs).
  CHECK(tb[0] == "parser protobuf");
  CHECK(tb[1] == "version brain.Event:2");
  for (int step = 0; step < 10; ++step) {
    char loss[64], lr[64];
    std::snprintf(loss, sizeof(loss), "%d loss %.9g", step, lossAt(step));
    std::snprintf(lr, sizeof(lr), "%d lr %.9g", step, lrAt(step));
    CHECK(tb[2 + 2 * step] == loss);
    CHECK(tb[3 + 2 * step] == lr);
  }
  CHECK(tb[22] == "10 eval/accuracy 0.75");

  const auto csv = lines(readFile(dir + "/metrics.csv"));
  REQUIRE(csv.size() == 1 + 21);
  CHECK(csv[0] == "step,wall_time,name,value");
  const auto jsonl = lines(readFile(dir + "/metrics.jsonl"));
  REQUIRE(jsonl.size() == 11);
  for (int step = 0; step < 10; ++step) {
    const auto j = nlohmann::json::parse(jsonl[step]);
    CHECK(j["step"] == step);
    CHECK(j["loss"].get<double>() == lossAt(step));
    CHECK(j["lr"].get<double>() == lrAt(step));
    // The CSV's rows of this log: the same step, wall time and values.
    for (int k = 0; k < 2; ++k) {
      const auto& row = csv[1 + 2 * step + k];
      std::vector<std::string> cells;
      std::istringstream in(row);
      for (std::string cell; std::getline(in, cell, ',');) cells.push_back(cell);
      REQUIRE(cells.size() == 4);
      CHECK(cells[0] == std::to_string(step));
      CHECK(std::stod(cells[1]) == j["wall_time"].get<double>());
      CHECK(cells[2] == (k == 0 ? "loss" : "lr"));
      CHECK(std::stod(cells[3]) == (k == 0 ? lossAt(step) : lrAt(step)));
    }
  }
  CHECK(nlohmann::json::parse(jsonl[10])["eval/accuracy"] == 0.75);

  const auto config = nlohmann::json::parse(readFile(dir + "/config.json"));
  CHECK(config["lr"] == 0.001);
  CHECK(config["model"] == "gpt");
  CHECK(config["layers"] == 12);
  CHECK(config["bf16"] == true);

  const auto report = readFile(project + "/report.html");
  CHECK(report.find("finished") != std::string::npos);
  CHECK(report.find("<svg") != std::string::npos);
  CHECK(report.find("eval/accuracy") != std::string::npos);
  CHECK(report.find("gpt") != std::string::npos);
  CHECK(report.find("world size") != std::string::npos);
  CHECK(report.find("http") == report.find("http://www.w3.org/2000/svg"));  // nothing fetched
}

TEST_CASE("The report is rewritten every N logs while the run goes on", "[trackers]") {
  TempDir tmp;
  rt::Trackers trackers({{"csv"}, tmp.path(), "r", 3}, {}, {});
  const auto report = tmp.path() + "/report.html";
  CHECK(readFile(report).find("Nothing logged yet") != std::string::npos);
  trackers.log({{"loss", 1}}, 1);
  trackers.log({{"loss", 2}}, 2);
  CHECK(readFile(report).find("Nothing logged yet") != std::string::npos);
  trackers.log({{"loss", 3}}, 3);
  const auto third = readFile(report);
  CHECK(third.find("Nothing logged yet") == std::string::npos);
  CHECK(third.find("running") != std::string::npos);
  trackers.finish();
  CHECK(readFile(report).find("class=\"finished\"") != std::string::npos);
}

TEST_CASE("Values that are not finite: text in CSV, null in JSON, gaps in the plot", "[trackers]") {
  TempDir tmp;
  {
    rt::Trackers trackers({{"csv", "jsonl"}, tmp.path(), "r", 10}, {}, {});
    trackers.log({{"loss", 1.5}}, 1);
    trackers.log({{"loss", std::nan("")}}, 2);
    trackers.log({{"loss", INFINITY}}, 3);
    trackers.log({{"loss", 0.5}}, 4);
  }
  const auto csv = lines(readFile(tmp.path() + "/r/metrics.csv"));
  REQUIRE(csv.size() == 5);
  CHECK(csv[2].substr(csv[2].rfind(',') + 1) == "nan");
  CHECK(csv[3].substr(csv[3].rfind(',') + 1) == "inf");
  const auto jsonl = lines(readFile(tmp.path() + "/r/metrics.jsonl"));
  CHECK(nlohmann::json::parse(jsonl[1])["loss"].is_null());
  rt::ReportSeries series{"loss", {{1, 1.5}, {2, std::nan("")}, {3, 2.0}, {4, 0.5}}};
  const auto svg = rt::svgPlot(series, 400, 200);
  // Two pieces: M at step 1, then a fresh M after the gap.
  const auto d = svg.substr(svg.find("d=\""));
  CHECK(std::count(d.begin(), d.begin() + static_cast<long>(d.find('"', 3)), 'M') == 2);
}

TEST_CASE("Tracker names: one error naming every unknown one and the known ones", "[trackers]") {
  CHECK(cxxlaunch::parseTrackerList("", "x").empty());
  CHECK(cxxlaunch::parseTrackerList(" CSV , jsonl,csv", "x") ==
        std::vector<std::string>{"csv", "jsonl"});
  CHECK(cxxlaunch::parseTrackerList("all", "x") ==
        std::vector<std::string>{"tensorboard", "csv", "jsonl"});
  try {
    cxxlaunch::parseTrackerList("tensorbord,wandb,csv", "--log_with");
    FAIL("no error");
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    CHECK(m.find("--log_with") != std::string::npos);
    CHECK(m.find("'tensorbord' (did you mean 'tensorboard'?)") != std::string::npos);
    CHECK(m.find("'wandb'") != std::string::npos);
    CHECK(m.find("tensorboard, csv and jsonl") != std::string::npos);
  }
}

TEST_CASE("A project folder that cannot be written is named when the trackers start",
          "[trackers]") {
  TempDir tmp;
  // A regular file where a folder should be: unwritable whoever runs the test (root too).
  std::ofstream(tmp.path() + "/file") << "x";
  const std::string project = tmp.path() + "/file/project";
  try {
    rt::Trackers trackers({{"csv"}, project, "r", 10}, {}, {});
    FAIL("no error");
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    CHECK(m.find("'" + project + "' cannot be written") != std::string::npos);
    CHECK(m.find("--project_dir") != std::string::npos);
  }
  CHECK_THROWS_WITH(rt::Trackers({{"csv"}, "", "r", 10}, {}, {}), Catch::Contains("--project_dir"));
  CHECK_THROWS_WITH(rt::Trackers({{"csv"}, tmp.path(), "a/b", 10}, {}, {}),
                    Catch::Contains("not a folder name"));
  rt::Trackers trackers({{"csv"}, tmp.path(), "r", 10}, {}, {});
  CHECK_THROWS_WITH(trackers.log({{"step", 1.0}}, 1), Catch::Contains("another name"));
}

TEST_CASE("A long series is plotted from a bounded number of points, its spikes kept",
          "[trackers]") {
  rt::ReportSeries series{"loss", {}};
  for (int i = 0; i < 100000; ++i) series.points.emplace_back(i, i == 54321 ? 100.0 : 1.0);
  const auto svg = rt::svgPlot(series, 400, 200);
  const auto d = svg.substr(svg.find("d=\""));
  const auto segments = std::count(d.begin(), d.begin() + static_cast<long>(d.find('"', 3)), 'L');
  CHECK(segments < 2100);
  CHECK(svg.find(">100<") != std::string::npos);  // the spike sets the axis' top
}

TEST_CASE("A short series has a marker on each value and a long one is a line only", "[trackers]") {
  const auto markers = [](const rt::ReportSeries& series) {
    const auto svg = rt::svgPlot(series, 480, 220);
    size_t count = 0;
    for (size_t at = svg.find("class=\"point\""); at != std::string::npos;
         at = svg.find("class=\"point\"", at + 1)) {
      ++count;
    }
    return count;
  };
  // An evaluation before and after training: two points, each drawn, not only a line between.
  CHECK(markers({"eval/loss", {{0, 3.17}, {100, 2.41}}}) == 2);
  CHECK(markers({"eval/loss", {{5, 3.17}}}) == 1);
  CHECK(markers({"loss", {{1, 1.0}, {2, std::nan("")}, {3, 0.5}}}) == 2);  // none at a gap
  rt::ReportSeries fifty{"loss", {}}, longer{"loss", {}};
  for (int i = 0; i < 50; ++i) fifty.points.emplace_back(i, 1.0 / (i + 1));
  for (int i = 0; i < 51; ++i) longer.points.emplace_back(i, 1.0 / (i + 1));
  CHECK(markers(fifty) == 50);
  CHECK(markers(longer) == 0);
}

TEST_CASE("Bytes that are not UTF-8 in the config are escaped, not thrown on", "[trackers]") {
  TempDir tmp;
  // A --data path in Latin-1, as finetune records it; and a key of such bytes.
  const std::string data = "corpus-\xe9t\xe9.txt";
  {
    rt::Trackers trackers({cxxlaunch::parseTrackerList("all", "test"), tmp.path(), "r", 10},
                          {{"data", data}, {"k\xff", 1}}, {{"host", "h\xfe"}});
  }
  const auto config = nlohmann::json::parse(readFile(tmp.path() + "/r/config.json"));
  CHECK(config["data"] == "corpus-\\xe9t\\xe9.txt");
  CHECK(config["k\\xff"] == 1);
  const auto report = readFile(tmp.path() + "/report.html");
  CHECK(cxxlaunch::isValidUtf8(report));
  CHECK(report.find("corpus-\\xe9t\\xe9.txt") != std::string::npos);
  CHECK(report.find("h\\xfe") != std::string::npos);
}

TEST_CASE("A metric name that is not UTF-8 is escaped in every tracker's file", "[trackers]") {
  TempDir tmp;
  {
    rt::Trackers trackers({cxxlaunch::parseTrackerList("all", "test"), tmp.path(), "r", 10}, {},
                          {});
    trackers.log({{"loss\xff", 1.5}, {"caf\xc3\xa9", 2.5}}, 1);  // the second is valid UTF-8
  }
  const std::string dir = tmp.path() + "/r";
  const auto j = nlohmann::json::parse(lines(readFile(dir + "/metrics.jsonl")).at(0));
  CHECK(j["loss\\xff"] == 1.5);
  CHECK(j["caf\xc3\xa9"] == 2.5);
  const auto csv = lines(readFile(dir + "/metrics.csv"));
  REQUIRE(csv.size() == 3);
  CHECK(csv[1].find(",loss\\xff,1.5") != std::string::npos);
  CHECK(csv[2].find(",caf\xc3\xa9,2.5") != std::string::npos);
  // TensorBoard's reader decodes a tag as UTF-8; Protobuf's parser refuses one that is not.
  const auto read = run({"/usr/bin/python3", READ_TFEVENTS_PY, eventFileIn(dir)});
  INFO(read.err);
  REQUIRE(read.exit_code == 0);
  CHECK(read.out.find("1 loss\\xff 1.5\n") != std::string::npos);
  CHECK(read.out.find("1 caf\xc3\xa9 2.5\n") != std::string::npos);
  const auto report = readFile(tmp.path() + "/report.html");
  CHECK(cxxlaunch::isValidUtf8(report));
  CHECK(report.find("<h3>loss\\xff</h3>") != std::string::npos);
}

TEST_CASE("CSV name cells a spreadsheet would run as formulas are quoted but numbers are not",
          "[trackers]") {
  TempDir tmp;
  {
    rt::Trackers trackers({{"csv"}, tmp.path(), "r", 10}, {}, {});
    trackers.log({{"=HYPERLINK(\"http://x\",\"y\")", 1},
                  {"+1", 2},
                  {"-2", 3},
                  {"@SUM(A1)", 4},
                  {"\tx", 5},
                  {"\rx", 6},
                  {"a;=1", 7},
                  {"a-b=c", 8},
                  {"loss", -3.5},
                  {"eval/loss", -INFINITY}},
                 -1);
  }
  const auto text = readFile(tmp.path() + "/r/metrics.csv");
  // OWASP: a leading single quote, inside double quotes, double quotes doubled.
  for (const std::string row :
       {"\"'=HYPERLINK(\"\"http://x\"\",\"\"y\"\")\",1\n", "\"'+1\",2\n", "\"'-2\",3\n",
        "\"'@SUM(A1)\",4\n", "\"'\tx\",5\n", "\"'\rx\",6\n"}) {
    CHECK(text.find("," + row) != std::string::npos);
  }
  CHECK(text.find(",\"a;=1\",7\n") != std::string::npos);  // ';' separates cells elsewhere
  CHECK(text.find(",a-b=c,8\n") != std::string::npos);     // nothing to fear inside a cell
  // The value column is a number we format: -3.5 stays -3.5, and the step -1 stays -1.
  CHECK(text.find("\n-1,") != std::string::npos);
  CHECK(text.find(",loss,-3.5\n") != std::string::npos);
  CHECK(text.find(",eval/loss,-inf\n") != std::string::npos);
}

TEST_CASE("A symlink or a FIFO where a tracker writes is never written through", "[trackers]") {
  TempDir tmp;
  const std::string victim = tmp.path() + "/victim";
  std::ofstream(victim) << "precious";
  ::chmod(victim.c_str(), 0600);
  const std::string project = tmp.path() + "/project";
  ::mkdir(project.c_str(), 0755);
  for (const std::string name : {"metrics.csv", "metrics.jsonl"}) {
    INFO(name);
    const std::string run_dir = project + "/" + name.substr(8);
    ::mkdir(run_dir.c_str(), 0755);
    REQUIRE(::symlink(victim.c_str(), (run_dir + "/" + name).c_str()) == 0);
    CHECK_THROWS_WITH(rt::Trackers({{"csv", "jsonl"}, project, name.substr(8), 10}, {}, {}),
                      Catch::Contains("'" + run_dir + "/" + name + "' is a symlink"));
  }
  // A FIFO: refused at once, not waited on.
  ::mkdir((project + "/fifo").c_str(), 0755);
  REQUIRE(::mkfifo((project + "/fifo/metrics.csv").c_str(), 0644) == 0);
  CHECK_THROWS_WITH(rt::Trackers({{"csv"}, project, "fifo", 10}, {}, {}),
                    Catch::Contains("not a regular file"));
  // A run folder that is a symlink: refused.
  REQUIRE(::symlink(tmp.path().c_str(), (project + "/linked").c_str()) == 0);
  CHECK_THROWS_WITH(rt::Trackers({{"csv"}, project, "linked", 10}, {}, {}),
                    Catch::Contains("the run folder '" + project + "/linked' is a symlink"));
  // config.json and report.html are replaced whole: a symlink there is replaced, not followed.
  ::mkdir((project + "/cfg").c_str(), 0755);
  REQUIRE(::symlink(victim.c_str(), (project + "/cfg/config.json").c_str()) == 0);
  ::unlink((project + "/report.html").c_str());
  REQUIRE(::symlink(victim.c_str(), (project + "/report.html").c_str()) == 0);
  { rt::Trackers trackers({{"csv"}, project, "cfg", 10}, {{"lr", 0.5}}, {}); }
  CHECK(readFile(victim) == "precious");
  struct stat st {};
  REQUIRE(::lstat((project + "/report.html").c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
  CHECK(nlohmann::json::parse(readFile(project + "/cfg/config.json"))["lr"] == 0.5);
  // No temporary file left behind.
  for (const auto& name : filesIn(project)) CHECK(name.find(".tmp.") == std::string::npos);
}

TEST_CASE("A project or run folder that others can write is refused, nothing written in it",
          "[trackers]") {
  TempDir tmp;
  for (const mode_t mode : {0777, 01777, 0775, 0757}) {
    const std::string project = tmp.path() + "/p" + std::to_string(mode);
    ::mkdir(project.c_str(), 0700);
    ::chmod(project.c_str(), mode);
    char shown[8];
    std::snprintf(shown, sizeof(shown), "%04o", static_cast<unsigned>(mode));
    INFO(shown);
    try {
      rt::Trackers trackers({{"csv"}, project, "r", 10}, {}, {});
      FAIL("no error");
    } catch (const InvalidArgument& e) {
      const std::string m = e.what();
      CHECK(m.find("the project folder '" + project + "' is writable by others (mode " + shown +
                   ")") != std::string::npos);
      CHECK(m.find("--project_dir") != std::string::npos);
    }
    CHECK(filesIn(project).empty());
  }
  const std::string project = tmp.path() + "/ok";
  ::mkdir(project.c_str(), 0755);
  ::mkdir((project + "/shared").c_str(), 0755);
  ::chmod((project + "/shared").c_str(), 0777);
  CHECK_THROWS_WITH(
      rt::Trackers({{"csv"}, project, "shared", 10}, {}, {}),
      Catch::Contains("the run folder '" + project + "/shared' is writable by others (mode 0777)"));
  CHECK(filesIn(project + "/shared").empty());
  // A folder made here is the user's own: 0755 whatever the umask lets through.
  rt::Trackers trackers({{"csv"}, tmp.path() + "/new/project", "r", 10}, {}, {});
}

TEST_CASE("Each step label of a plot stands at its own step", "[trackers]") {
  // Five evenly spaced ticks over steps 1..4 fall at 1.75, 2.5 and 3.25: labelled as rounded,
  // "2" and "3" stood between steps, and "3" twice.
  const auto svg = rt::svgPlot({"loss", {{1, 0.5}, {2, 0.4}, {3, 0.45}, {4, 0.3}}}, 480, 220);
  const double left = 64, plot_w = 480 - 64 - 16;
  std::vector<int> labels;
  for (size_t at = svg.find("<text class=\"step\" x=\""); at != std::string::npos;
       at = svg.find("<text class=\"step\" x=\"", at + 1)) {
    const double x = std::stod(svg.substr(at + 22));
    const int step = std::stoi(svg.substr(svg.find('>', at) + 1));
    CHECK(x == Approx(left + (step - 1) / 3.0 * plot_w).margin(0.01));
    labels.push_back(step);
  }
  CHECK(labels == std::vector<int>{1, 2, 3, 4});
}
