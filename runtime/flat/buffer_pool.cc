#include "runtime/flat/buffer_pool.h"

#include <ATen/ops/empty.h>
#include <c10/core/Storage.h>

namespace cxxlaunch::runtime {

c10::DataPtr BufferPool::take(size_t bytes, c10::Allocator* allocator) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = kept_.begin(); it != kept_.end(); ++it) {
      if (it->bytes == bytes) {
        c10::DataPtr ptr = std::move(it->ptr);
        kept_.erase(it);
        return ptr;
      }
    }
  }
  return allocator->allocate(bytes);
}

void BufferPool::give(c10::DataPtr ptr, size_t bytes) {
  if (bytes == 0 || capacity_ == 0) return;  // nothing worth keeping: freed here
  c10::DataPtr dropped;                      // freed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  if (kept_.size() == capacity_) {
    dropped = std::move(kept_.front().ptr);
    kept_.pop_front();
  }
  kept_.push_back({bytes, std::move(ptr)});
}

torch::Tensor BufferPool::zeros(int64_t numel, const torch::TensorOptions& options) {
  const size_t bytes =
      static_cast<size_t>(numel) * c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
  c10::Allocator* allocator = c10::GetAllocator(options.device().type());
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, take(bytes, allocator), allocator,
                       /*resizable=*/true);
  torch::Tensor t = at::empty({0}, options);
  t.set_(storage, 0, {numel}, {1});
  return t.zero_();
}

void BufferPool::recycle(torch::Tensor& t) {
  if (t.defined() && t.use_count() == 1 && t.storage().use_count() == 1) {
    c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    const size_t bytes = storage->nbytes();
    give(storage->set_data_ptr(c10::DataPtr(nullptr, t.device())), bytes);
    storage->set_nbytes(0);
  }
  t = torch::Tensor();
}

size_t BufferPool::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t total = 0;
  for (const auto& k : kept_) total += k.bytes;
  return total;
}

}  // namespace cxxlaunch::runtime
