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
// - Always, at no cost to a collective that completes within kCompareAfter: a rank still waiting
//   then puts its call in the store and reads a peer's (rank 0 watches rank 1, the others rank
//   0); a peer waiting in the same numbered call of another kind (a collective called on some
//   ranks only) fails the wait at once, naming each rank's call and the public API that issued it
//   (CollectiveApi): "saveCheckpoint is a collective: every rank must call it". On one host the
//   shared-memory path (shm_collectives.h) finds such a mismatch at the call's first barrier.
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

// The time the calling thread has spent in Work::wait of checked collectives, in all: the time a
// rank waited for its peers (and for the transfer), which its step's own work leaves out
// (heartbeat.h, the straggler check of docs/observability.md).
std::chrono::nanoseconds collectiveWaitOnThisThread();

// How long a collective waits before its rank compares its call with a peer's (see above).
inline constexpr std::chrono::milliseconds kCompareAfter{2000};

// While one lives, the collectives the calling thread issues are counted as `api`'s (a public
// call such as "saveCheckpoint", a string literal): the messages above name it. The outermost
// one of nested calls wins (saveCheckpoint's, not the saveState it calls).
class CollectiveApi {
 public:
  explicit CollectiveApi(const char* api);
  ~CollectiveApi();
  CollectiveApi(const CollectiveApi&) = delete;
  CollectiveApi& operator=(const CollectiveApi&) = delete;
  // The calling thread's current API, or nullptr.
  static const char* current();

 private:
  const char* previous_;
};

}  // namespace cxxlaunch::runtime
