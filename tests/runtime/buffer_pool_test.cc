// BufferPool: freed buffers come back for the next allocation of their size, each size class keeps
// at most its count, a size without a class is not kept, and a tensor's memory is recycled only
// when nothing else shares it.

#include "runtime/flat/buffer_pool.h"

#include <torch/torch.h>

#include <catch2/catch.hpp>

#include "runtime/flat/flat_param.h"

using cxxlaunch::runtime::BufferPool;
using cxxlaunch::runtime::FlatParameter;

TEST_CASE("A buffer given back is the one the next take of its size gets", "[buffer_pool]") {
  BufferPool pool;
  pool.addClass(1 << 20, 1);
  pool.addClass(4096, 1);
  c10::Allocator* cpu = c10::GetAllocator(c10::kCPU);
  c10::DataPtr a = pool.take(1 << 20, cpu);
  void* where = a.get();
  pool.give(std::move(a), 1 << 20);
  REQUIRE(pool.bytes() == (1 << 20));
  REQUIRE(pool.take(4096, cpu).get() != where);  // another size: a fresh allocation
  c10::DataPtr again = pool.take(1 << 20, cpu);
  REQUIRE(again.get() == where);
  REQUIRE(pool.bytes() == 0);
}

TEST_CASE("Each size class keeps at most its count, and a size without a class is freed",
          "[buffer_pool]") {
  BufferPool pool;
  pool.addClass(1000, 1);
  pool.addClass(1000, 1);  // classes of one size add up
  pool.addClass(3000, 1);
  REQUIRE(pool.capacity() == 5000);
  c10::Allocator* cpu = c10::GetAllocator(c10::kCPU);
  const std::vector<size_t> sizes = {1000, 1000, 1000, 2000, 3000, 3000};
  std::vector<c10::DataPtr> taken;
  for (size_t bytes : sizes) taken.push_back(pool.take(bytes, cpu));
  const void* newest = taken[1].get();
  for (size_t i = 0; i < sizes.size(); ++i) pool.give(std::move(taken[i]), sizes[i]);
  REQUIRE(pool.bytes() == 5000);  // two of 1000, one of 3000; the third 1000 and the 2000 freed
  REQUIRE(pool.take(1000, cpu).get() == newest);  // the last kept comes first
  BufferPool none;
  none.give(none.take(1000, cpu), 1000);
  REQUIRE(none.bytes() == 0);
}

TEST_CASE("zeros come zeroed from reused memory, and shared tensors are not recycled",
          "[buffer_pool]") {
  BufferPool pool;
  pool.addClass(4000, 4);
  torch::Tensor t = pool.zeros(1000, torch::kFloat);
  REQUIRE(t.sum().item<float>() == 0);
  t.fill_(7);
  const void* where = t.data_ptr();
  pool.recycle(t);
  REQUIRE(!t.defined());
  REQUIRE(pool.bytes() == 4000);
  torch::Tensor u = pool.zeros(1000, torch::kFloat);
  REQUIRE(u.data_ptr() == where);
  REQUIRE(u.abs().sum().item<float>() == 0);  // the 7s are gone
  torch::Tensor view = u.narrow(0, 10, 10);   // shares the storage: must stay valid
  pool.recycle(u);
  REQUIRE(pool.bytes() == 0);
  view.fill_(1);
  REQUIRE(view.sum().item<float>() == 10);
}

TEST_CASE("A flat parameter released into a pool restores from it", "[buffer_pool]") {
  BufferPool pool;
  std::vector<torch::Tensor> params = {torch::randn({10, 10}), torch::randn({7})};
  FlatParameter flat(params, {"a", "b"}, 2, 0);
  pool.addClass(static_cast<size_t>(flat.padded()) * 4, 2);
  const void* where = flat.full().data_ptr();
  flat.release(&pool);
  REQUIRE(!flat.resident());
  REQUIRE(pool.bytes() == static_cast<size_t>(flat.padded()) * 4);
  flat.restore(&pool);
  REQUIRE(flat.full().data_ptr() == where);
  REQUIRE(pool.bytes() == 0);
  flat.full().fill_(2);
  REQUIRE(params[0].sum().item<float>() == 200);  // the parameters still view the buffer
}
