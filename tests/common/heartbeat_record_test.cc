// common/heartbeat_record.h: the progress record a worker's heartbeat file holds.

#include "common/heartbeat_record.h"

#include <catch2/catch.hpp>
#include <fstream>

#include "support/subprocess.h"

using namespace cxxlaunch;

TEST_CASE("A heartbeat record reads back as written, at its fixed size", "[common][heartbeat]") {
  HeartbeatRecord r;
  r.steps = 120;
  r.total = 600;
  r.loss = 0.4312;
  r.step_us = 52000;
  r.work_us = 31000;
  const std::string text = formatHeartbeatRecord(r);
  CHECK(text.size() == kHeartbeatRecordBytes);
  CHECK(text.back() == '\n');
  CHECK(text.starts_with("cxxlaunch-heartbeat 1 steps=120 total=600 "));
  CHECK(parseHeartbeatRecord(text) == r);

  HeartbeatRecord none;  // nothing known yet but a total
  none.total = 7;
  const auto back = parseHeartbeatRecord(formatHeartbeatRecord(none));
  REQUIRE(back);
  CHECK(back->total == 7);
  CHECK_FALSE(back->loss);

  // The largest values still fit.
  HeartbeatRecord big;
  big.steps = big.total = big.step_us = big.work_us = INT64_MAX;
  big.loss = -1.234567e-300;
  CHECK(parseHeartbeatRecord(formatHeartbeatRecord(big)) == big);
}

TEST_CASE("A torn, empty or foreign heartbeat file holds no record", "[common][heartbeat]") {
  HeartbeatRecord r;
  r.steps = 120;
  r.total = 600;
  std::string text = formatHeartbeatRecord(r);
  CHECK_FALSE(parseHeartbeatRecord(""));  // a beat of a runtime that only touches the file
  std::string torn = text;
  torn[text.find("120")] = '9';  // half of a rewrite from 120 to 999
  CHECK_FALSE(parseHeartbeatRecord(torn));
  CHECK_FALSE(parseHeartbeatRecord(text.substr(0, 40)));  // no newline, no checksum
  std::string other = text;
  other.replace(0, 21, "cxxlaunch-heartbeat 2");
  CHECK_FALSE(parseHeartbeatRecord(other));

  testing::TempDir dir;
  const std::string path = dir.path() + "/heartbeat";
  CHECK_FALSE(readHeartbeatRecord(path));  // not there
  std::ofstream(path) << "";
  CHECK_FALSE(readHeartbeatRecord(path));
  std::ofstream(path) << text;
  CHECK(readHeartbeatRecord(path) == parseHeartbeatRecord(text));
}
