#include "proto/tensorboard_event.h"

#include "proto/tensorboard.pb.h"

namespace cxxlaunch::tensorboard {

std::string fileVersionEvent(double wall_time) {
  Event event;
  event.set_wall_time(wall_time);
  event.set_file_version("brain.Event:2");
  return event.SerializeAsString();
}

std::string scalarsEvent(double wall_time, int64_t step,
                         const std::vector<std::pair<std::string, double>>& scalars) {
  Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  auto* summary = event.mutable_summary();
  for (const auto& [tag, value] : scalars) {
    auto* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  return event.SerializeAsString();
}

}  // namespace cxxlaunch::tensorboard
