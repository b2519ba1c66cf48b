#pragma once
// TensorBoard's Event messages as bytes (proto/tensorboard.proto), for the event-file writer of
// runtime/observability/: its callers see no generated header.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace cxxlaunch::tensorboard {

// The first event of every file: TensorBoard checks its version ("brain.Event:2").
std::string fileVersionEvent(double wall_time);

// One event holding a scalar summary per (tag, value): TensorBoard's simple_value is a float.
std::string scalarsEvent(double wall_time, int64_t step,
                         const std::vector<std::pair<std::string, double>>& scalars);

}  // namespace cxxlaunch::tensorboard
