#include "runtime/flat/buffer_pool.h"

#include <ATen/ops/empty.h>
#include <c10/core/Storage.h>

namespace cxxlaunch::runtime {

void BufferPool::addClass(size_t bytes, size_t count) {
  if (bytes == 0 || count == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  classes_[bytes].count += count;
}

c10::DataPtr BufferPool::take(size_t bytes, c10::Allocator* allocator) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = classes_.find(bytes);
    if (it != classes_.end() && !it->second.kept.empty()) {
      c10::DataPtr ptr = std::move(it->second.kept.back());
      it->second.kept.pop_back();
      return ptr;
    }
  }
  return allocator->allocate(bytes);
}

void BufferPool::give(c10::DataPtr ptr, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = classes_.find(bytes);
  if (it == classes_.end() || it->second.kept.size() >= it->second.count) return;  // freed here
  it->second.kept.push_back(std::move(ptr));
}

torch::Tensor BufferPool::empty(int64_t numel, const torch::TensorOptions& options) {
  const size_t bytes =
      static_cast<size_t>(numel) * c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
  c10::Allocator* allocator = c10::GetAllocator(options.device().type());
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, take(bytes, allocator), allocator,
                       /*resizable=*/true);
  torch::Tensor t = at::empty({0}, options);
  t.set_(storage, 0, {numel}, {1});
  return t;
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
  for (const auto& [bytes, c] : classes_) total += bytes * c.kept.size();
  return total;
}

size_t BufferPool::capacity() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t total = 0;
  for (const auto& [bytes, c] : classes_) total += bytes * c.count;
  return total;
}

}  // namespace cxxlaunch::runtime
