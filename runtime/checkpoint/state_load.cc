#include "runtime/checkpoint/state_load.h"

#include <torch/types.h>
#include <torch/utils.h>

#include "common/error.h"
#include "runtime/checkpoint/load_memory.h"

namespace cxxlaunch::runtime::checkpoint {

float* HostStaging::hostOf(const torch::Tensor& destination) {
  if (destination.is_cpu() && destination.is_contiguous() &&
      destination.scalar_type() == torch::kFloat) {
    return destination.data_ptr<float>();
  }
  // With its present values: what no read covers (a shard's padding) stays as it was.
  torch::NoGradGuard no_grad;
  copies_.emplace_back(destination, emptyForReading({destination.numel()}));
  copies_.back().second.copy_(destination.detach().reshape({-1}));
  return copies_.back().second.data_ptr<float>();
}

void HostStaging::copyBack() {
  torch::NoGradGuard no_grad;
  for (auto& [destination, host] : copies_) destination.copy_(host.view(destination.sizes()));
  copies_.clear();
}

namespace {

std::vector<tensorfile::ReadRequest> requestsOf(const std::vector<StateRead>& reads,
                                                HostStaging& staging) {
  std::vector<tensorfile::ReadRequest> out;
  out.reserve(reads.size());
  for (const auto& r : reads) {
    out.push_back({r.param, r.array, r.begin, r.end, r.shape, staging.hostOf(r.into)});
  }
  return out;
}

}  // namespace

StateLoad::StateLoad(const tensorfile::Reader& reader, Backend& backend)
    : source_(reader), reader_(&reader), backend_(&backend) {}

StateLoad::StateLoad(const tensorfile::Source& source) : source_(source) {}

bool StateLoad::has(const std::string& param, const std::string& array) const {
  return source_.has(param, array);
}

int64_t StateLoad::wholeCounter(const std::string& key, int64_t fallback) const {
  return source_.wholeCounter(key, fallback);
}

void StateLoad::read(const std::vector<StateRead>& reads) {
  if (failure_) return;  // the load has failed: what it reads now is thrown away
  HostStaging staging;
  try {
    source_.readAll(requestsOf(reads, staging));
  } catch (...) {
    failure_ = std::current_exception();
    return;
  }
  staging.copyBack();
}

void StateLoad::readReplicated(const std::vector<StateRead>& reads,
                               const std::vector<int>& readers) {
  // NCCL carries device memory only; the reads land in host memory.
  if (reader_ == nullptr || backend_->worldSize() == 1 || backend_->name() == "nccl") {
    read(reads);
    return;
  }
  HostStaging staging;
  readShared(requestsOf(reads, staging), readers);
  if (!failure_) staging.copyBack();
}

void StateLoad::readShared(const std::vector<tensorfile::ReadRequest>& reads,
                           const std::vector<int>& readers) {
  // Every rank checks the same requests against the same files: all of them stop here alike,
  // before any broadcast.
  try {
    reader_->check(reads);
  } catch (...) {
    if (!failure_) failure_ = std::current_exception();
    return;
  }
  const int rank = backend_->rank(), world = backend_->worldSize();
  std::vector<WorkPtr> sent;
  for (size_t i = 0, end; i < reads.size(); i = end) {
    for (end = i + 1; end < reads.size() && reads[end].param == reads[i].param;) ++end;
    if (readers[i] == rank && !failure_) {
      try {
        reader_->readAll({reads.begin() + static_cast<ptrdiff_t>(i),
                          reads.begin() + static_cast<ptrdiff_t>(end)});
      } catch (...) {
        failure_ = std::current_exception();
      }
    }
    for (size_t k = i; k < end; ++k) {
      const auto count = static_cast<size_t>(reads[k].end - reads[k].begin);
      if (count == 0) continue;  // an empty parameter: the same on every rank
      sent.push_back(backend_->broadcast(reads[k].out, count, DType::kFloat32, readers[k]));
    }
  }
  for (auto& work : sent) work->wait();
  int32_t failed = failure_ ? rank : world;  // the lowest failing rank
  backend_->allreduce(&failed, 1, DType::kInt32, ReduceOp::kMin)->wait();
  if (failed != world && !failure_) {
    failure_ = std::make_exception_ptr(
        CommunicationError("rank " + std::to_string(failed) + " could not read its share of '" +
                           reader_->directory() + "' (its log says why)"));
  }
}

void StateLoad::finish() {
  if (failure_) std::rethrow_exception(failure_);
}

}  // namespace cxxlaunch::runtime::checkpoint
