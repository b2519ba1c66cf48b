#pragma once
// CheckedBackend: every backend the runtime uses, wrapped so that a hang explains itself.
//
// - Always (cheap: a few words per call): a ring of this rank's last kHistory collectives, with
//   their sequence number, operation, dtype, element count and whether they completed. When a
//   collective times out, the error (and so the rank's log and its error file, which the
//   launcher's failure table shows) names it and lists the history; and through the store each
//   rank that timed out publishes where it is and reads where the others are, so the message
//   says which rank was behind, and where ("rank 1: last in #41 allGather ..., #42 never
//   started"), or that a rank never answered (busy outside collectives, stopped, or gone).
// - In debug mode (accelerate's `debug: true`, CXXLAUNCH_DEBUG): before each collective, the
//   ranks all-gather its description (operation, dtype, count, root) and compare; any
//   difference fails at once on every rank, naming each rank's call, instead of hanging or
//   reducing garbage. One small extra collective per call.
//
// Thread-safety: as the wrapped backend (the runtime issues collectives from its communication
// thread and its training thread; the history has its own lock).

#include <chrono>
#include <memory>
#include <string>

#include "rendezvous/store.h"
#include "runtime/comm/backend.h"
#include "runtime/heartbeat.h"

namespace cxxlaunch::runtime {

struct CheckOptions {
  bool debug = false;                           // compare every collective across ranks first
  std::shared_ptr<rendezvous::Store> store;     // where timed-out ranks say where they are
  std::string prefix = "checked";               // its keys (one per group)
  std::chrono::milliseconds report_wait{3000};  // how long a timed-out rank waits for the others
  // Beaten every second while a collective waits for its peers (heartbeat.h); null: none.
  std::shared_ptr<Heartbeat> heartbeat;
};

std::unique_ptr<Backend> makeCheckedBackend(std::unique_ptr<Backend> inner, CheckOptions options);

}  // namespace cxxlaunch::runtime
