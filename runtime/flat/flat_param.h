#pragma once
// FlatParameter: the parameters of one shard unit living as views into one contiguous buffer,
// padded at the end to a multiple of the world size so that it splits into equal shards: rank r
// owns elements [r * shardNumel(), (r + 1) * shardNumel()). Each collective on a unit is then one
// call on one buffer, and the layout is exactly what all-gather and reduce-scatter produce.
//
// The parameters stay the module's own tensors (same TensorImpl, so optimizers and hooks that
// hold them keep working); set_data re-points them into the buffer. Under ZeRO-3 the buffer's
// storage is released between uses (release()) while the views remain: autograd keeps its
// references, and restore() gives the views memory again before anything reads them.
//
// Thread-safety: none; the owning strategy serialises access.

#include <torch/types.h>

#include <string>
#include <vector>

#include "runtime/flat/buffer_pool.h"

namespace cxxlaunch::runtime {

class FlatParameter {
 public:
  FlatParameter() = default;
  // Moves `params` (same dtype and device) into one buffer of numel() rounded up to a multiple of
  // `world_size`; the padding is zero.
  FlatParameter(std::vector<torch::Tensor> params, std::vector<std::string> names, int world_size,
                int rank);

  // The layout alone (offsets and numel, one rank): the parameters stay in their own storage
  // and there is no buffer (resident() false, never restored). The data-parallel engine's units
  // under DDP, whose parameters the trainer's optimizer steps where they are: only their
  // gradients are flat.
  static FlatParameter layoutOf(std::vector<torch::Tensor> params, std::vector<std::string> names);
  // The elements of each rank's shard for `numel` parameter elements over `world_size` ranks.
  static int64_t shardNumelOf(int64_t numel, int world_size) {
    return (numel + world_size - 1) / world_size;
  }

  const std::vector<torch::Tensor>& params() const { return params_; }
  const std::vector<std::string>& names() const { return names_; }
  int64_t offset(size_t i) const { return offsets_[i]; }
  int64_t numel() const { return numel_; }    // the parameters' elements
  int64_t padded() const { return padded_; }  // numel rounded up to a multiple of the world size
  int64_t shardNumel() const { return shard_numel_; }
  int64_t shardBegin() const { return shard_begin_; }

  // The whole buffer (padded elements) and this rank's slice of it. Both are views of storage
  // that release() empties.
  torch::Tensor& full() { return full_; }
  torch::Tensor shard() const { return full_.narrow(0, shard_begin_, shard_numel_); }

  // Frees the buffer's memory; the parameters' views stay (reading them is an error until
  // restore()). restore() allocates it again; the content is undefined until written. With a
  // pool, the memory goes to it and comes from it.
  void release(BufferPool* pool = nullptr);
  void restore(BufferPool* pool = nullptr);
  // Re-creates the buffer in `dtype` (values converted) and re-points the parameters into it:
  // mixed precision's compute copies.
  void convert(torch::ScalarType dtype);
  bool resident() const { return resident_; }
  size_t residentBytes() const;

 private:
  void layOut(int world_size, int rank);  // offsets and sizes; checks dtype and device
  void pointParamsIntoBuffer();           // copies each parameter into its place, then set_data

  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<int64_t> offsets_;
  int64_t numel_ = 0, padded_ = 0, shard_numel_ = 0, shard_begin_ = 0;
  torch::Tensor full_;
  bool resident_ = true;
};

}  // namespace cxxlaunch::runtime
