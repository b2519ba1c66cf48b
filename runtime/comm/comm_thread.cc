#include "runtime/comm/comm_thread.h"

#include "common/error.h"

namespace cxxlaunch::runtime {

void ThreadWork::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return done_; })) {
    throw TimeoutError("collective did not complete within " + std::to_string(timeout.count()) +
                       " ms");
  }
  if (error_) std::rethrow_exception(error_);
}

bool ThreadWork::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void ThreadWork::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

CommThread::CommThread() : thread_([this] { loop(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

WorkPtr CommThread::submit(std::function<void()> op) {
  auto work = std::make_shared<ThreadWork>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(std::move(op), work);
  }
  cv_.notify_one();
  return work;
}

void CommThread::loop() {
  for (;;) {
    std::pair<std::function<void()>, std::shared_ptr<ThreadWork>> next;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr error;
    try {
      next.first();
    } catch (...) {
      error = std::current_exception();
    }
    next.second->finish(error);
  }
}

}  // namespace cxxlaunch::runtime
