#include "runtime/precision/loss_scaler.h"

#include <algorithm>
#include <cstdio>

#include "common/error.h"

namespace cxxlaunch::runtime {

LossScaler::LossScaler(LossScalerOptions options)
    : options_(options), scale_(options.initial_scale), hysteresis_left_(options.hysteresis) {
  if (!(options_.initial_scale > 0) || !(options_.min_scale > 0) ||
      options_.initial_scale < options_.min_scale) {
    throw InvalidArgument("loss scaling: initial_scale must be > 0 and >= min_scale");
  }
  if (!(options_.growth_factor > 1) || !(options_.backoff_factor > 0) ||
      !(options_.backoff_factor < 1)) {
    throw InvalidArgument("loss scaling: growth_factor must be > 1 and backoff_factor in (0, 1)");
  }
  if (options_.growth_interval < 1 || options_.hysteresis < 1) {
    throw InvalidArgument("loss scaling: growth_interval and hysteresis must be >= 1");
  }
}

void LossScaler::update(bool overflow) {
  if (overflow) {
    ++skipped_;
    good_steps_ = 0;
    if (--hysteresis_left_ <= 0) {
      scale_ = std::max(scale_ * options_.backoff_factor, options_.min_scale);
      hysteresis_left_ = 1;  // until the scale grows again, every overflow backs off
    }
    return;
  }
  if (++good_steps_ == options_.growth_interval) {
    scale_ *= options_.growth_factor;
    good_steps_ = 0;
    hysteresis_left_ = options_.hysteresis;
  }
}

std::string LossScaler::save() const {
  char text[96];
  std::snprintf(text, sizeof(text), "%.17g,%d,%lld,%lld", scale_, hysteresis_left_,
                static_cast<long long>(good_steps_), static_cast<long long>(skipped_));
  return text;
}

void LossScaler::restore(const std::string& state) {
  double scale = 0;
  int hysteresis = 0;
  long long good = 0, skipped = 0;
  if (std::sscanf(state.c_str(), "%lg,%d,%lld,%lld", &scale, &hysteresis, &good, &skipped) != 4 ||
      !(scale > 0) || hysteresis < 0 || good < 0 || skipped < 0) {
    throw InvalidArgument("loss scaler state '" + state + "' is malformed");
  }
  scale_ = scale;
  hysteresis_left_ = hysteresis;
  good_steps_ = good;
  skipped_ = skipped;
}

}  // namespace cxxlaunch::runtime
