#include "runtime/checkpoint/async_save.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <exception>
#include <new>
#include <stdexcept>

#include "common/error.h"

namespace cxxlaunch::runtime::checkpoint {
namespace {

double secondsSince(AsyncSaver::Clock::time_point from) {
  return std::chrono::duration<double>(AsyncSaver::Clock::now() - from).count();
}

// Host memory for a snapshot on the CPU, aligned to transparent huge pages: the first copy into
// it takes a page fault per 2 MiB rather than per 4 KiB (half the time of a 1 GB copy here).
torch::Tensor hugePageBuffer(int64_t numel) {
  constexpr size_t kHugePage = 2u << 20;
  const size_t bytes = std::max<size_t>(static_cast<size_t>(numel) * sizeof(float), 1);
  const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* data = nullptr;
  if (::posix_memalign(&data, kHugePage, rounded) != 0) throw std::bad_alloc();
  ::madvise(data, rounded, MADV_HUGEPAGE);  // advice: where it is refused, small pages serve
  return torch::from_blob(
      data, {numel}, [](void* p) { std::free(p); }, torch::kFloat);
}

// How much lower the writer's priority is than the training thread's, in nice steps (Linux keeps
// a nice value per thread; the write-behind thread of its file inherits it). The scheduler then
// gives the writer about a tenth of a core that a training thread also wants, and all of one
// that training leaves idle (a collective, the GPU): on a machine with few cores the steps that
// overlap the write lose less to it. Not SCHED_IDLE or nice 19: beside other work (a build at
// nice 10 on this machine) the writer then starves, its write spills past the next save and that
// save waits for it (measured 2026-12-04: blocked 0.32x a synchronous save against 0.05x).
constexpr int kWriterNiceIncrement = 10;

int niceOf(pid_t tid) {
  errno = 0;
  const int nice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
  return errno == 0 ? nice : 0;
}

// Advice: where refused (raising a priority back needs CAP_SYS_NICE or RLIMIT_NICE), the thread
// keeps the one it has.
void setNice(pid_t tid, int nice) {
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), std::clamp(nice, -20, 19));
}

}  // namespace

AsyncSaver::~AsyncSaver() { abandon(); }

torch::Tensor& AsyncSaver::snapshot(int64_t numel, bool pinned) {
  if (!snapshot_.defined() || snapshot_.numel() < numel || snapshot_pinned_ != pinned) {
    snapshot_ = torch::Tensor();  // freed before the next is made: never two snapshots
    snapshot_ =
        pinned
            ? torch::empty({numel}, torch::TensorOptions().dtype(torch::kFloat).pinned_memory(true))
            : hugePageBuffer(numel);
    snapshot_pinned_ = pinned;
  }
  return snapshot_;
}

void AsyncSaver::reserve(int64_t numel, bool pinned) {
  if (inFlight() || writer_.joinable() || numel <= 0) return;
  if (snapshot_.defined() && snapshot_.numel() >= numel && snapshot_pinned_ == pinned) return;
  try {
    writer_ = std::thread([this, numel, pinned] {
      try {
        torch::Tensor& buffer = snapshot(numel, pinned);
        auto* bytes = static_cast<volatile char*>(buffer.data_ptr());
        const size_t size = static_cast<size_t>(buffer.numel()) * sizeof(float);
        for (size_t i = 0; i < size; i += 4096) bytes[i] = 0;
      } catch (const std::exception&) {  // then the first save makes it, and says what failed
        snapshot_ = torch::Tensor();
      }
    });
  } catch (const std::system_error&) {  // no thread to be had: the first save makes it
  }
}

std::string AsyncSaver::begin(Backend& backend, const std::string& dir,
                              std::vector<std::pair<std::string, std::string>> blobs,
                              tensorfile::Counters counters, Clock::time_point began) {
  if (inFlight()) throw std::logic_error("AsyncSaver: a save started with one in flight");
  if (writer_.joinable()) writer_.join();  // reserve()'s
  std::string staging = stage(backend, dir);
  flight_.emplace();
  flight_->dir = dir;
  flight_->counters = std::move(counters);
  flight_->blobs = withCounters(std::move(blobs), flight_->counters);
  flight_->began = began;
  return staging;
}

void AsyncSaver::start(Backend& backend, const std::string& dir, const StateStream& state,
                       std::vector<std::pair<std::string, std::string>> blobs,
                       tensorfile::Counters counters, bool pinned, Clock::time_point began) {
  const std::string staging = begin(backend, dir, std::move(blobs), std::move(counters), began);
  std::string error;
  std::vector<torch::Tensor> regions;  // where each array goes, in produce()'s order
  try {
    int64_t numel = 0;
    for (const auto& l : state.layout) {
      numel += (l.end - l.begin) * static_cast<int64_t>(l.arrays.size());
    }
    torch::Tensor& buffer = snapshot(numel, pinned);
    int64_t at = 0;
    for (const auto& l : state.layout) {
      StateView view{l.param, l.shape, l.begin, l.end, {}};
      for (const auto& name : l.arrays) {
        regions.push_back(buffer.narrow(0, at, l.end - l.begin));
        view.arrays.emplace_back(name, regions.back());
        at += l.end - l.begin;
      }
      flight_->views.push_back(std::move(view));
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  // Every rank runs every gather of produce() (the full layout's), whatever happens to its own
  // snapshot, or the others would wait for it; an error is agreed on once the gathers are over.
  size_t next = 0;
  try {
    torch::NoGradGuard no_grad;
    state.produce([&](const torch::Tensor& array) {
      if (!error.empty()) return;
      try {
        if (next == regions.size() || regions[next].numel() != array.numel()) {
          throw InvalidArgument("checkpoint: the state's arrays do not match its layout");
        }
        // From a GPU: queued copies into pinned memory where the arrays stay, waited for once,
        // below; a gathered array's buffer is reused by the next gather, so it is copied at once.
        regions[next++].copy_(array.reshape({-1}), /*non_blocking=*/pinned && state.arrays_stay);
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
    if (pinned) torch::cuda::synchronize();
  } catch (const std::exception& e) {  // reading the state back from nvme
    if (error.empty()) error = e.what();
  }
  if (error.empty() && next != regions.size()) {
    error = "checkpoint: the state gave fewer arrays than its layout";
  }
  launch(backend, staging, error);
}

void AsyncSaver::launch(Backend& backend, const std::string& staging,
                        const std::string& snapshot_error) {
  int32_t all_ok = snapshot_error.empty() ? 1 : 0;
  backend.allreduce(&all_ok, 1, DType::kInt32, ReduceOp::kMin)->wait();
  if (all_ok == 0) {
    const std::string dir = flight_->dir;
    flight_.reset();
    throw CommunicationError(
        "checkpoint: snapshotting the state for '" + dir + "' failed" +
        (snapshot_error.empty() ? " on another rank (see its log)" : ": " + snapshot_error) +
        "; the previous checkpoint is untouched");
  }
  Flight* flight = &*flight_;
  auto write = [flight, path = staging + "/" + tensorfile::rankFileName(backend.rank())] {
    try {
      flight->written = writeShardFile(path, flight->views, flight->blobs);
    } catch (const std::exception& e) {
      flight->error = e.what();
    }
  };
  done_.store(false);
  training_nice_ = niceOf(::gettid());
  try {
    writer_ = std::thread([this, write] {
      {
        std::lock_guard<std::mutex> lock(writer_tid_mu_);
        writer_tid_ = ::gettid();
        setNice(writer_tid_, training_nice_ + kWriterNiceIncrement);
      }
      write();
      {
        std::lock_guard<std::mutex> lock(writer_tid_mu_);
        writer_tid_ = 0;  // from here on the id may name another thread
      }
      done_.store(true, std::memory_order_release);
    });
  } catch (const std::system_error&) {  // no thread to be had: written here, as a sync save
    write();
    done_.store(true, std::memory_order_release);
  }
  flight->blocked_seconds = secondsSince(flight->began);
}

std::optional<SaveReport> AsyncSaver::poll(Backend& backend) {
  if (!flight_) return std::nullopt;
  int32_t all_done = done_.load(std::memory_order_acquire) ? 1 : 0;
  backend.allreduce(&all_done, 1, DType::kInt32, ReduceOp::kMin)->wait();
  if (all_done == 0) return std::nullopt;
  return commitFlight(backend, Clock::now());
}

std::optional<SaveReport> AsyncSaver::finish(Backend& backend) {
  if (!flight_) return std::nullopt;
  return commitFlight(backend, Clock::now());
}

void AsyncSaver::joinWriter() {
  {
    // Training now waits for the writer: where allowed, it gets the training's priority back.
    std::lock_guard<std::mutex> lock(writer_tid_mu_);
    if (writer_tid_ != 0) setNice(writer_tid_, training_nice_);
  }
  if (writer_.joinable()) writer_.join();
}

SaveReport AsyncSaver::commitFlight(Backend& backend, Clock::time_point waited_from) {
  joinWriter();
  Flight flight = std::move(*flight_);
  flight_.reset();  // committed or failed, it is no longer in flight
  const uint64_t bytes = commit(backend, flight.dir, flight.counters, flight.written, flight.error,
                                "writing the rank files of '" + flight.dir + "' in the background");
  return {flight.dir, bytes, secondsSince(flight.began),
          flight.blocked_seconds + secondsSince(waited_from)};
}

void AsyncSaver::abandon() {
  joinWriter();
  flight_.reset();
}

}  // namespace cxxlaunch::runtime::checkpoint
