#pragma once
// CommThread: the one thread on which a CPU backend runs its collectives, in submission order,
// so that collectives overlap with the caller's compute (DDP's backward) and every rank executes
// them in the same order. Internal to runtime/.

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "runtime/comm/backend.h"

namespace cxxlaunch::runtime {

// A Work completed by the communication thread.
class ThreadWork final : public Work {
 public:
  void wait(std::chrono::milliseconds timeout) override;
  bool done() const override;
  void finish(std::exception_ptr error);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

class CommThread {
 public:
  CommThread();
  ~CommThread();  // runs what is queued, then stops
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Queues `op`; its exception, if any, becomes the Work's error.
  WorkPtr submit(std::function<void()> op);

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<void()>, std::shared_ptr<ThreadWork>>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace cxxlaunch::runtime
