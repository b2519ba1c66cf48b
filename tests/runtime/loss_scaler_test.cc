// The fp16 loss scaler's schedule: back-off after `hysteresis` overflows, growth after
// growth_interval clean steps, the floor, and options that cannot work.

#include "runtime/precision/loss_scaler.h"

#include <catch2/catch.hpp>

#include "common/error.h"

using namespace cxxlaunch::runtime;

TEST_CASE("The loss scale grows after growth_interval clean steps", "[loss_scaler]") {
  LossScaler scaler({.initial_scale = 1024, .growth_interval = 3});
  for (int i = 0; i < 2; ++i) scaler.update(false);
  CHECK(scaler.scale() == 1024);
  scaler.update(false);
  CHECK(scaler.scale() == 2048);
  for (int i = 0; i < 3; ++i) scaler.update(false);
  CHECK(scaler.scale() == 4096);
  CHECK(scaler.skippedSteps() == 0);
}

TEST_CASE("Hysteresis: the scale backs off at the hysteresis-th overflow, then at each",
          "[loss_scaler]") {
  LossScaler scaler({.initial_scale = 1024, .growth_interval = 2, .hysteresis = 2});
  scaler.update(true);
  CHECK(scaler.scale() == 1024);  // the first overflow is tolerated
  scaler.update(true);
  CHECK(scaler.scale() == 512);
  scaler.update(true);
  CHECK(scaler.scale() == 256);
  // An overflow resets the clean-step count; growth restores the hysteresis.
  scaler.update(false);
  scaler.update(true);
  CHECK(scaler.scale() == 128);
  scaler.update(false);
  scaler.update(false);
  CHECK(scaler.scale() == 256);
  scaler.update(true);
  CHECK(scaler.scale() == 256);
  CHECK(scaler.skippedSteps() == 5);
}

TEST_CASE("The loss scale never goes below min_scale", "[loss_scaler]") {
  LossScaler scaler({.initial_scale = 4, .hysteresis = 1, .min_scale = 2});
  for (int i = 0; i < 5; ++i) scaler.update(true);
  CHECK(scaler.scale() == 2);
}

TEST_CASE("Loss scaler options that cannot work are refused", "[loss_scaler]") {
  using cxxlaunch::InvalidArgument;
  CHECK_THROWS_AS(LossScaler({.initial_scale = 0}), InvalidArgument);
  CHECK_THROWS_AS(LossScaler({.initial_scale = 1, .min_scale = 2}), InvalidArgument);
  CHECK_THROWS_AS(LossScaler({.growth_factor = 1}), InvalidArgument);
  CHECK_THROWS_AS(LossScaler({.backoff_factor = 1}), InvalidArgument);
  CHECK_THROWS_AS(LossScaler({.growth_interval = 0}), InvalidArgument);
  CHECK_THROWS_AS(LossScaler({.hysteresis = 0}), InvalidArgument);
}
