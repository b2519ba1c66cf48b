#pragma once
// The evaluation data loader of Accelerator::prepareEvalDataLoader (accelerate's prepared
// DataLoader with even_batches): the dataset in order, in batches of `batch_size` per process,
// every rank the same number of full batches. Batch k of rank r holds the examples
// [(k * world + r) * batch_size, ... + batch_size), so that gathering batch k from every rank
// (rank order) gives the dataset's next world * batch_size examples in order; the examples
// past the end are the first ones again (padding). The loop's position is shared with the
// Accelerator (EvalPosition), whose gatherForMetrics drops the padding of the last batch.
//
// Thread-safety: one thread, as any LibTorch loader.

#include <torch/data/samplers/base.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace cxxlaunch::runtime {

// Where the evaluation loop that began last is.
struct EvalPosition {
  int64_t batch = -1;  // the batch its loop is at; -1: none begun; `batches`: past the end
  int64_t batches = 0;
  size_t batch_size = 0;
  size_t last_batch_examples = 0;  // the real examples of the last batch, over all ranks
};

class EvalSampler final : public torch::data::samplers::Sampler<> {
 public:
  EvalSampler(size_t examples, size_t world, size_t rank, size_t batch_size);
  void reset(torch::optional<size_t> = torch::nullopt) override { next_ = 0; }
  torch::optional<std::vector<size_t>> next(size_t batch_size) override;
  void save(torch::serialize::OutputArchive&) const override {}
  void load(torch::serialize::InputArchive&) override {}

  // Batches per rank: ceil(examples / (world * batch_size)).
  static int64_t batchesOf(size_t examples, size_t world, size_t batch_size);

 private:
  std::vector<size_t> indices_;  // this rank's, batch after batch
  size_t next_ = 0;
};

// LibTorch's iterator, moving the shared position as it goes.
template <typename Inner>
class EvalIterator {
 public:
  EvalIterator(Inner inner, EvalPosition* position)
      : inner_(std::move(inner)), position_(position) {}
  decltype(auto) operator*() { return *inner_; }
  auto operator->() { return inner_.operator->(); }
  EvalIterator& operator++() {
    ++inner_;
    if (position_) ++position_->batch;
    return *this;
  }
  bool operator==(const EvalIterator& other) const { return inner_ == other.inner_; }
  bool operator!=(const EvalIterator& other) const { return !(*this == other); }

 private:
  Inner inner_;
  EvalPosition* position_;
};

template <typename Loader>
class PreparedEvalDataLoader {
 public:
  PreparedEvalDataLoader(std::unique_ptr<Loader> loader, std::shared_ptr<EvalPosition> shared,
                         EvalPosition mine)
      : loader_(std::move(loader)), shared_(std::move(shared)), mine_(mine) {}
  // Starts a pass over the dataset: gatherForMetrics follows this loop from here on.
  auto begin() {
    *shared_ = mine_;
    shared_->batch = 0;
    return EvalIterator<decltype(loader_->begin())>(loader_->begin(), shared_.get());
  }
  auto end() { return EvalIterator<decltype(loader_->end())>(loader_->end(), nullptr); }
  int64_t batchesPerProcess() const { return mine_.batches; }
  Loader& torchLoader() { return *loader_; }

 private:
  std::unique_ptr<Loader> loader_;
  std::shared_ptr<EvalPosition> shared_;
  EvalPosition mine_;
};

}  // namespace cxxlaunch::runtime
