#pragma once
// Asynchronous saves (the Accelerator's checkpoint_async): checkpoint.h's save() in two halves.
//
// In the foreground, start() prepares the staging directory (a collective) and copies this
// rank's part of the state into a host snapshot: one buffer, pinned where the state is on a GPU,
// kept and reused by every save, so that there is never more than one snapshot in memory. A
// background thread then writes this rank's file from the snapshot, with the format and
// checksums of a synchronous save. In the full layout (state_view.h) the gathers are collectives:
// they run in start(), unit by unit into rank 0's snapshot, and only the writing is left to the
// background.
//
// The commit (the manifest and the swap, checkpoint.h's steps 2 and 3) needs every rank's file,
// and all cross-rank agreement runs in the foreground, on the training thread, never beside
// the training's collectives on the same communicator: the background thread does file I/O and
// nothing else. poll() (the Accelerator's step()) asks every rank whether its write is over and
// commits once all are; finish() (the next save, a load, the end of training) waits for it.
// Until the commit the checkpoint is incomplete (no manifest), so a crash at any instant
// leaves what a crash during a synchronous save leaves: the previous complete checkpoint. A
// write that failed on any rank (disk full, I/O error) is an error on every rank at that poll
// or finish, naming the checkpoint; the folder keeps its previous checkpoints.
//
// The writer thread runs at a lower priority than the training thread (ten nice steps), so that
// training preempts it on a machine short of cores; once training waits for it (the next save, a
// load, the end) it gets the training's priority back where the process may raise priorities.
//
// Thread-safety: the training thread calls every method; the writer thread touches only the
// snapshot and its own file (and its own thread id, under a mutex).

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/checkpoint/checkpoint.h"
#include "runtime/reports.h"

namespace cxxlaunch::runtime::checkpoint {

class AsyncSaver {
 public:
  using Clock = std::chrono::steady_clock;
  AsyncSaver() = default;
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;
  // Abandons the save in flight (see abandon()).
  ~AsyncSaver();

  // Snapshots this rank's `state` (state_view.h: its arrays are read, and where the layout is
  // full gathered, before this returns) and starts writing it to `dir` in the background; a
  // collective. `pinned`: the snapshot in pinned memory (the state is on a GPU). `began`: when
  // the caller's save began (its time counts as blocked). A save in flight must have been
  // finished first.
  void start(Backend& backend, const std::string& dir, const StateStream& state,
             std::vector<std::pair<std::string, std::string>> blobs, tensorfile::Counters counters,
             bool pinned, Clock::time_point began);

  // Whether a save was started and not yet committed (the same on every rank).
  bool inFlight() const { return flight_.has_value(); }
  // A collective when a save is in flight: commits it if every rank's write is over.
  std::optional<SaveReport> poll(Backend& backend);
  // A collective when a save is in flight: waits for every rank's write, then commits.
  std::optional<SaveReport> finish(Backend& backend);
  // Not a collective: waits for this rank's writer and drops the save uncommitted (its staging
  // directory stays incomplete). For a job on its way out with an error.
  void abandon();

  // Makes the snapshot of `numel` elements ahead of the first save, on the writer thread, its
  // pages touched there: fresh memory is slow to touch (a page fault per page; on a VM whose host
  // backs it lazily, slower than the disk), and the first save would otherwise pay for it. Not a
  // collective; nothing while a save is in flight or when the snapshot is large enough already.
  void reserve(int64_t numel, bool pinned);

 private:
  struct Flight {
    std::string dir;
    tensorfile::Counters counters;
    std::vector<StateView> views;  // of the snapshot
    std::vector<std::pair<std::string, std::string>> blobs;
    Clock::time_point began;
    double blocked_seconds = 0;
    // Set by the writer before it sets done_.
    std::pair<uint64_t, uint32_t> written{0, 0};
    std::string error;
  };
  // start()'s first half: waits for reserve()'s thread, prepares the staging directory (a
  // collective) and opens the flight; returns the staging directory.
  std::string begin(Backend& backend, const std::string& dir,
                    std::vector<std::pair<std::string, std::string>> blobs,
                    tensorfile::Counters counters, Clock::time_point began);
  // The snapshot of at least `numel` float32 elements.
  torch::Tensor& snapshot(int64_t numel, bool pinned);
  // Agrees that every rank's snapshot succeeded, then starts the writer.
  void launch(Backend& backend, const std::string& staging, const std::string& snapshot_error);
  SaveReport commitFlight(Backend& backend, Clock::time_point waited_from);
  // Joins the writer thread, giving a writer still at work the training's priority back first.
  void joinWriter();

  torch::Tensor snapshot_;
  bool snapshot_pinned_ = false;
  std::optional<Flight> flight_;
  std::thread writer_;  // the save in flight's writer, or reserve()'s
  std::atomic<bool> done_{false};
  // The writer runs at a lower priority than training (async_save.cc) until training waits for
  // it. Its thread id while it runs (0 otherwise), under the mutex: the id of a thread that has
  // ended may name another.
  std::mutex writer_tid_mu_;
  pid_t writer_tid_ = 0;
  int training_nice_ = 0;  // the training thread's nice value when the writer started
};

}  // namespace cxxlaunch::runtime::checkpoint
