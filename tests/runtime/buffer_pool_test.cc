// BufferPool: freed buffers come back for the next allocation of their size, at most `capacity`
// are kept, and a tensor's memory is recycled only when nothing else shares it.

#include "runtime/flat/buffer_pool.h"

#include <torch/torch.h>

#include <catch2/catch.hpp>

#include "runtime/flat/flat_param.h"

using cxxlaunch::runtime::BufferPool;
using cxxlaunch::runtime::FlatParameter;

TEST_CASE("A buffer given back is the one the next take of its size gets", "[buffer_pool]") {
  BufferPool pool(2);
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

TEST_CASE("The pool keeps at most its capacity, dropping the oldest", "[buffer_pool]") {
  BufferPool pool(2);
  c10::Allocator* cpu = c10::GetAllocator(c10::kCPU);
  for (size_t bytes : {1000, 2000, 3000}) pool.give(pool.take(bytes, cpu), bytes);
  REQUIRE(pool.bytes() == 5000);  // 2000 and 3000: the first went back to the system
  BufferPool none(0);
  none.give(none.take(1000, cpu), 1000);
  REQUIRE(none.bytes() == 0);
}

TEST_CASE("zeros come zeroed from reused memory, and shared tensors are not recycled",
          "[buffer_pool]") {
  BufferPool pool(4);
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
  BufferPool pool(2);
  std::vector<torch::Tensor> params = {torch::randn({10, 10}), torch::randn({7})};
  FlatParameter flat(params, {"a", "b"}, 2, 0);
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
