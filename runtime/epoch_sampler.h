#pragma once
// EpochSampler: the sampler of Accelerator::prepareDataLoader. LibTorch's
// DistributedRandomSampler (each rank a disjoint share of one shuffled order, the same on every
// rank), reshuffled at the start of each epoch with the epoch as its seed, as PyTorch's
// DistributedSampler after set_epoch(epoch): every epoch has its own order, the same on every
// rank and in every run. The epoch a loader starts next lives in `next_epoch`, which the loader
// that owns this sampler shares (PreparedDataLoader::setEpoch, and a resumed run's position).
//
// Thread-safety: one data loader's thread, as any LibTorch sampler.

#include <torch/data/samplers/base.h>
#include <torch/data/samplers/distributed.h>

#include <cstddef>
#include <memory>
#include <vector>

namespace cxxlaunch::runtime {

class EpochSampler final : public torch::data::samplers::Sampler<> {
 public:
  EpochSampler(size_t examples, size_t replicas, size_t rank, std::shared_ptr<size_t> next_epoch)
      : inner_(examples, replicas, rank, /*allow_duplicates=*/true),
        next_epoch_(std::move(next_epoch)) {}

  // A DataLoader calls this as each epoch begins.
  void reset(torch::optional<size_t> new_size = torch::nullopt) override {
    inner_.set_epoch((*next_epoch_)++);
    inner_.reset(new_size);
  }
  torch::optional<std::vector<size_t>> next(size_t batch_size) override {
    return inner_.next(batch_size);
  }
  void save(torch::serialize::OutputArchive& archive) const override { inner_.save(archive); }
  void load(torch::serialize::InputArchive& archive) override { inner_.load(archive); }

 private:
  torch::data::samplers::DistributedRandomSampler inner_;
  std::shared_ptr<size_t> next_epoch_;
};

}  // namespace cxxlaunch::runtime
