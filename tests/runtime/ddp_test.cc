// DDP and the Accelerator against a single process: ranks are threads over the Fake backend,
// so these tests exercise everything above the backend with exact, deterministic collectives.
// DDP is the strategy makeStrategy makes for "ddp": the data-parallel engine at stage 0, the
// trainer's optimizer stepping the parameters where they are (strategy/sharded.h).

#include <torch/torch.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <thread>

#include "rendezvous/memory_store.h"
#include "runtime/accelerator.h"
#include "runtime/strategy/sharded.h"
#include "runtime/world.h"
#include "support/mappings.h"
#include "support/ranks.h"

using namespace cxxlaunch::runtime;
using cxxlaunch::testing::onRanks;

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(6, 16))),
        fc2(register_module("fc2", torch::nn::Linear(16, 3))),
        unused(register_module("unused", torch::nn::Linear(16, 2))) {}
  // `branch`: whether the otherwise unused layer takes part (it differs between ranks).
  torch::Tensor forward(const torch::Tensor& x, bool branch = false) {
    auto h = torch::tanh(fc1(x));
    auto y = fc2(h);
    if (branch) y = y + unused(h).sum(1, true);
    return y;
  }
  torch::nn::Linear fc1, fc2, unused;
};
TORCH_MODULE(Net);

Net makeNet() {
  torch::manual_seed(42);
  return Net();
}

struct Data {
  torch::Tensor x, y;
};

Data makeData(int64_t n) {
  auto gen = at::detail::createCPUGenerator(7);
  Data d;
  d.x = torch::randn({n, 6}, gen);
  d.y = torch::randn({n, 3}, gen);
  return d;
}

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(Net& net, const std::string& kind) {
  if (kind == "sgd") {
    return std::make_unique<torch::optim::SGD>(net->parameters(),
                                               torch::optim::SGDOptions(0.1).momentum(0.9));
  }
  return std::make_unique<torch::optim::AdamW>(net->parameters(),
                                               torch::optim::AdamWOptions(0.01).weight_decay(0.1));
}

double maxRelativeDifference(Net& a, Net& b) {
  double worst = 0;
  auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    auto diff = (pa[i] - pb[i]).abs().max().item<double>();
    auto scale = std::max(pb[i].abs().max().item<double>(), 1e-12);
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

// The "ddp" strategy over `net`, as prepare makes it; a micro-step is backward().
struct Ddp {
  Ddp(Net& net, std::shared_ptr<Backend> backend, torch::optim::Optimizer& optimizer,
      StrategyOptions options = {}) {
    WorkerEnv env;
    env.rank = backend->rank();
    env.world_size = backend->worldSize();
    strategy = makeStrategy(env, std::move(backend), net.ptr(), optimizer, options);
  }
  void backward(const torch::Tensor& loss, bool sync = true) {
    strategy->beforeBackward(sync);
    loss.backward();
    strategy->afterBackward(sync);
  }
  std::unique_ptr<Strategy> strategy;
};

World fakeWorld(std::shared_ptr<FakeWorld> world, int rank, int size, int accumulation = 1) {
  World w;
  w.env.rank = rank;
  w.env.world_size = size;
  w.env.gradient_accumulation_steps = accumulation;
  w.backend = makeFakeBackend(std::move(world), rank);
  return w;
}

}  // namespace

TEST_CASE("DDP with world 2 matches one process on the whole batch", "[ddp]") {
  torch::set_num_threads(1);
  constexpr int64_t kBatch = 8, kSteps = 5;
  const Data data = makeData(2 * kBatch);
  // set_to_none: gradients reset to undefined between steps, as LibTorch 2's zero_grad() does,
  // so that DDP has to bring them back into its buckets every step.
  for (const auto& [kind, set_to_none] : std::vector<std::pair<std::string, bool>>{
           {"sgd", false}, {"adamw", false}, {"adamw", true}}) {
    INFO("optimizer " << kind << (set_to_none ? ", gradients set to none" : ""));
    auto clearGrads = [set_to_none = set_to_none](Net& net, torch::optim::Optimizer& opt) {
      if (!set_to_none) return opt.zero_grad();
      for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
    };
    Net reference = makeNet();
    auto ref_opt = makeOptimizer(reference, kind);
    for (int64_t s = 0; s < kSteps; ++s) {
      clearGrads(reference, *ref_opt);
      torch::mse_loss(reference->forward(data.x), data.y).backward();
      ref_opt->step();
    }
    std::vector<Net> nets = {makeNet(), makeNet()};
    // Rank 1 starts from other weights: DDP must broadcast rank 0's.
    {
      torch::NoGradGuard no_grad;
      for (auto& p : nets[1]->parameters()) p.add_(1.0);
    }
    auto world = makeFakeWorld(2);
    onRanks(2, [&](int r) {
      Net& net = nets[static_cast<size_t>(r)];
      StrategyOptions options;
      options.find_unused_parameters = true;  // the unused layer keeps no gradient, as in 1 process
      auto opt = makeOptimizer(net, kind);
      Ddp ddp(net, makeFakeBackend(world, r), *opt, options);
      auto x = data.x.narrow(0, r * kBatch, kBatch), y = data.y.narrow(0, r * kBatch, kBatch);
      for (int64_t s = 0; s < kSteps; ++s) {
        clearGrads(net, *opt);
        ddp.backward(torch::mse_loss(net->forward(x), y));
        ddp.strategy->step();
      }
    });
    CHECK(maxRelativeDifference(nets[0], reference) < 1e-6);
    CHECK(maxRelativeDifference(nets[1], reference) < 1e-6);
  }
}

TEST_CASE("DDP is the data-parallel engine at stage 0 in every precision", "[ddp]") {
  // One engine: fp32 DDP (the trainer's optimizer stepping the parameters in place) and DDP with
  // mixed precision (fp32 masters stepped by the engine) are both ShardedStrategy at stage 0.
  torch::set_num_threads(1);
  for (const bool mixed : {false, true}) {
    INFO((mixed ? "bf16 compute" : "fp32"));
    Net net = makeNet();
    auto opt = makeOptimizer(net, "adamw");
    StrategyOptions options;
    if (mixed) options.precision.compute = torch::kBFloat16;
    Ddp ddp(net, makeFakeBackend(makeFakeWorld(1), 0), *opt, options);
    CHECK(dynamic_cast<ShardedStrategy*>(ddp.strategy.get()) != nullptr);
  }
}

TEST_CASE("Gradients live in the buckets: no second copy, the same memory every step", "[ddp]") {
  torch::set_num_threads(1);
  const Data data = makeData(8);
  Net net = makeNet();
  auto opt = makeOptimizer(net, "adamw");
  Ddp ddp(net, makeFakeBackend(makeFakeWorld(1), 0), *opt);
  std::vector<const void*> first;
  for (int step = 0; step < 3; ++step) {
    ddp.strategy->zeroGrad();
    ddp.backward(torch::mse_loss(net->forward(data.x, /*branch=*/true), data.y));
    ddp.strategy->step();
    std::vector<const void*> now;
    for (auto& p : net->parameters()) now.push_back(p.grad().data_ptr());
    if (step == 0) first = now;
    CHECK(now == first);
  }
  // One bucket in reverse registration order: each gradient ends where the one before starts.
  auto params = net->parameters();
  for (size_t i = 0; i + 1 < params.size(); ++i) {
    CHECK(static_cast<const float*>(params[i + 1].grad().data_ptr()) + params[i + 1].numel() ==
          params[i].grad().data_ptr());
  }
}

TEST_CASE("Over Gloo on one host the gradients live in shared memory and match one process",
          "[ddp][shm]") {
  // Real Gloo backends (ranks as threads, each with its own mapping of the segments): the
  // buckets are registered shared memory, so each param.grad() lies in a /dev/shm segment and
  // the all-reduce reads the peers' buckets in place. Were the buckets ordinary memory again
  // (a copy in and out of every reduction), the mapping check fails. With shared memory off the
  // same training runs through TCP, as between hosts.
  torch::set_num_threads(1);
  constexpr int64_t kBatch = 8, kSteps = 4;
  const Data data = makeData(2 * kBatch);
  Net reference = makeNet();
  auto ref_opt = makeOptimizer(reference, "adamw");
  for (int64_t s = 0; s < kSteps; ++s) {
    ref_opt->zero_grad();
    torch::mse_loss(reference->forward(data.x), data.y).backward();
    ref_opt->step();
  }
  const std::string ours = "/dev/shm/cxxlaunch-" + std::to_string(::getpid()) + "-buffer-";
  for (const bool shared_memory : {true, false}) {
    INFO("shared memory " << (shared_memory ? "on" : "off"));
    auto store = std::make_shared<cxxlaunch::rendezvous::MemoryStore>();
    std::vector<Net> nets = {makeNet(), makeNet()};
    std::vector<int> shared(2), in_segment(2);
    onRanks(2, [&](int r) {
      Net& net = nets[static_cast<size_t>(r)];
      BackendOptions backend_options;
      backend_options.rank = r;
      backend_options.world_size = 2;
      backend_options.store = store;
      backend_options.timeout = std::chrono::seconds(30);
      backend_options.shared_memory = shared_memory;
      std::shared_ptr<Backend> backend = makeGlooBackend(backend_options);
      StrategyOptions options;
      options.find_unused_parameters = true;  // the unused layer keeps no gradient, as in 1 process
      options.bucket_bytes = 256;             // several buckets, reduced as backward goes
      auto opt = makeOptimizer(net, "adamw");
      Ddp ddp(net, backend, *opt, options);
      shared[static_cast<size_t>(r)] =
          ddp.strategy->describe().ends_with("gradient bucket(s) in shared memory");
      auto x = data.x.narrow(0, r * kBatch, kBatch), y = data.y.narrow(0, r * kBatch, kBatch);
      int segment = 1;
      for (int64_t s = 0; s < kSteps; ++s) {
        ddp.strategy->zeroGrad();
        ddp.backward(torch::mse_loss(net->forward(x), y));
        for (const auto& p : net->parameters()) {
          if (p.grad().defined()) {
            segment =
                segment && cxxlaunch::testing::mappedFileOf(p.grad().data_ptr()).starts_with(ours);
          }
        }
        ddp.strategy->step();
      }
      in_segment[static_cast<size_t>(r)] = segment;
    });
    for (int r = 0; r < 2; ++r) {
      CHECK(shared[static_cast<size_t>(r)] == shared_memory);
      CHECK(in_segment[static_cast<size_t>(r)] == shared_memory);
    }
    CHECK(maxRelativeDifference(nets[0], reference) < 1e-6);
    CHECK(maxRelativeDifference(nets[1], reference) < 1e-6);
  }
}

TEST_CASE("A second backward before the gradients are synchronised is refused", "[ddp]") {
  torch::set_num_threads(1);
  const Data data = makeData(8);
  Net net = makeNet();
  auto opt = makeOptimizer(net, "sgd");
  Ddp ddp(net, makeFakeBackend(makeFakeWorld(1), 0), *opt);
  ddp.strategy->beforeBackward(true);
  auto loss = torch::mse_loss(net->forward(data.x), data.y);
  loss.backward({}, /*retain_graph=*/true);
  CHECK_THROWS_WITH(loss.backward(),
                    Catch::Contains("got a second gradient before the gradients were reduced"));
}

TEST_CASE("Small buckets give the same result as one bucket", "[ddp]") {
  torch::set_num_threads(1);
  const Data data = makeData(8);
  Net reference = makeNet();
  torch::mse_loss(reference->forward(data.x), data.y).backward();
  std::vector<Net> nets = {makeNet(), makeNet()};
  auto world = makeFakeWorld(2);
  std::string described;
  onRanks(2, [&](int r) {
    StrategyOptions options;
    options.bucket_bytes = 64;  // one bucket per parameter
    auto opt = makeOptimizer(nets[static_cast<size_t>(r)], "sgd");
    Ddp ddp(nets[static_cast<size_t>(r)], makeFakeBackend(world, r), *opt, options);
    if (r == 0) described = ddp.strategy->describe();
    ddp.backward(torch::mse_loss(nets[static_cast<size_t>(r)]->forward(data.x.narrow(0, r * 4, 4)),
                                 data.y.narrow(0, r * 4, 4)));
  });
  CHECK(described == "ddp: 6 gradient bucket(s)");
  auto ref = reference->parameters(), got = nets[1]->parameters();
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!ref[i].grad().defined()) continue;
    CHECK(torch::allclose(got[i].grad(), ref[i].grad(), 1e-6, 1e-7));
  }
}

TEST_CASE("Parameters without a gradient on some rank do not hang the reduction", "[ddp]") {
  for (bool find_unused : {false, true}) {
    torch::set_num_threads(1);
    const Data data = makeData(8);
    std::vector<Net> nets = {makeNet(), makeNet()};
    auto world = makeFakeWorld(2);
    onRanks(2, [&](int r) {
      Net& net = nets[static_cast<size_t>(r)];
      StrategyOptions options;
      options.find_unused_parameters = find_unused;
      auto opt = makeOptimizer(net, "sgd");
      Ddp ddp(net, makeFakeBackend(world, r), *opt, options);
      // Only rank 1 uses the extra layer; rank 0 never produces its gradient.
      ddp.backward(torch::mse_loss(net->forward(data.x.narrow(0, r * 4, 4), r == 1),
                                   data.y.narrow(0, r * 4, 4)));
    });
    // Rank 0's share of the unused layer is zero: both ranks hold half of rank 1's gradient.
    CHECK(torch::equal(nets[0]->unused->weight.grad(), nets[1]->unused->weight.grad()));
    CHECK(nets[0]->unused->weight.grad().abs().sum().item<double>() > 0);
  }
}

TEST_CASE("find_unused_parameters leaves parameters no rank used without a gradient", "[ddp]") {
  torch::set_num_threads(1);
  const Data data = makeData(8);
  for (bool find_unused : {false, true}) {
    std::vector<Net> nets = {makeNet(), makeNet()};
    auto world = makeFakeWorld(2);
    onRanks(2, [&](int r) {
      StrategyOptions options;
      options.find_unused_parameters = find_unused;
      auto opt = makeOptimizer(nets[static_cast<size_t>(r)], "sgd");
      Ddp ddp(nets[static_cast<size_t>(r)], makeFakeBackend(world, r), *opt, options);
      ddp.backward(
          torch::mse_loss(nets[static_cast<size_t>(r)]->forward(data.x.narrow(0, r * 4, 4)),
                          data.y.narrow(0, r * 4, 4)));
    });
    const auto& grad = nets[0]->unused->weight.grad();
    if (find_unused) {
      CHECK_FALSE(grad.defined());
    } else {
      CHECK(grad.defined());
      CHECK(grad.abs().sum().item<double>() == 0);
    }
  }
}

TEST_CASE("Accumulation over k micro-steps equals one big step and no_sync defers the reduction",
          "[ddp][accelerator]") {
  torch::set_num_threads(1);
  constexpr int64_t kMicro = 4, kAccumulation = 2;
  const Data data = makeData(2 * kAccumulation * kMicro);
  // One process, one step on all 16 examples.
  Net reference = makeNet();
  auto ref_opt = makeOptimizer(reference, "adamw");
  torch::mse_loss(reference->forward(data.x), data.y).backward();
  std::vector<torch::Tensor> reference_grads;
  for (auto& p : reference->parameters()) {
    reference_grads.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  }
  ref_opt->step();

  std::vector<Net> nets = {makeNet(), makeNet()};
  auto world = makeFakeWorld(2);
  // What each rank saw, checked in the test thread (Catch2 is not thread-safe).
  struct Saw {
    bool stepped = false, differed_inside_no_sync = false, matched_at_sync = true;
    std::vector<int> sync_gradients;  // acc.syncGradients() before each micro-batch
  };
  std::vector<Saw> saw(2);
  onRanks(2, [&](int r) {
    Saw& mine = saw[static_cast<size_t>(r)];
    Net& net = nets[static_cast<size_t>(r)];
    AcceleratorOptions options;
    options.find_unused_parameters = true;
    Accelerator acc(fakeWorld(world, r, 2, kAccumulation), options);
    auto opt = makeOptimizer(net, "adamw");
    acc.prepare(net.ptr(), *opt);
    // Rank r sees examples [r*8, r*8+8) in two micro-batches of 4.
    for (int64_t m = 0; m < kAccumulation; ++m) {
      const int64_t first = r * kAccumulation * kMicro + m * kMicro;
      mine.sync_gradients.push_back(acc.syncGradients() ? 1 : 0);
      acc.backward(torch::mse_loss(net->forward(data.x.narrow(0, first, kMicro)),
                                   data.y.narrow(0, first, kMicro)));
      auto params = net->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        if (!reference_grads[i].defined()) continue;
        const bool close = torch::allclose(params[i].grad(), reference_grads[i], 1e-5, 1e-7);
        if (m < kAccumulation - 1 && !close) mine.differed_inside_no_sync = true;
        if (m == kAccumulation - 1 && !close) mine.matched_at_sync = false;
      }
      mine.stepped = acc.step();
    }
  });
  std::vector<int> sync_only_last(static_cast<size_t>(kAccumulation), 0);
  sync_only_last.back() = 1;
  for (const Saw& s : saw) {
    CHECK(s.sync_gradients == sync_only_last);
    CHECK(s.stepped);
    CHECK(s.differed_inside_no_sync);
    CHECK(s.matched_at_sync);
  }
  CHECK(maxRelativeDifference(nets[0], reference) < 1e-6);
  CHECK(maxRelativeDifference(nets[1], reference) < 1e-6);
}

TEST_CASE("Accelerator helpers: gather, clipping, memory report, batch description",
          "[accelerator]") {
  torch::set_num_threads(1);
  auto world = makeFakeWorld(3);
  std::vector<torch::Tensor> gathered(3);
  std::vector<std::string> described(3);
  std::vector<size_t> parameter_bytes(3);
  onRanks(3, [&](int r) {
    Accelerator acc(fakeWorld(world, r, 3, 2), AcceleratorOptions{});
    gathered[static_cast<size_t>(r)] = acc.gather(torch::full({2, 2}, static_cast<float>(r)));
    described[static_cast<size_t>(r)] = acc.describeBatch(16);
    Net net = makeNet();
    auto opt = makeOptimizer(net, "adamw");
    acc.prepare(net.ptr(), *opt);
    auto report = acc.memoryReport();
    parameter_bytes[static_cast<size_t>(r)] = static_cast<size_t>(report.parameters);
    acc.mainProcessFirst([] {});
    acc.waitForEveryone();
  });
  auto expected =
      torch::cat({torch::full({2, 2}, 0.f), torch::full({2, 2}, 1.f), torch::full({2, 2}, 2.f)});
  for (auto& g : gathered) CHECK(torch::equal(g, expected));
  for (size_t bytes : parameter_bytes) {
    CHECK(bytes == (6 * 16 + 16 + 16 * 3 + 3 + 16 * 2 + 2) * sizeof(float));
  }
  CHECK(described[0] == "global batch 96 = 16 per process x 3 processes x 2 accumulation steps");

  // Clipping: a single process, gradients of norm 5 scaled to 1.
  Accelerator one(fakeWorld(makeFakeWorld(1), 0, 1), AcceleratorOptions{});
  Net net = makeNet();
  auto opt = makeOptimizer(net, "sgd");
  one.prepare(net.ptr(), *opt);
  for (auto& p : net->parameters()) p.mutable_grad() = torch::zeros_like(p);
  net->fc2->bias.mutable_grad() = torch::tensor({3.f, 4.f, 0.f});
  CHECK(one.clipGradNorm(1.0) == Approx(5.0));
  CHECK(net->fc2->bias.grad().norm().item<double>() == Approx(1.0).epsilon(1e-4));
}

TEST_CASE("LR schedules follow transformers' formulas", "[scheduler]") {
  Net net = makeNet();
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(1.0));
  LrScheduler linear(opt, LrScheduler::Kind::kLinear, 2, 10);
  CHECK(linear.factor() == Approx(0.0));
  linear.step();
  CHECK(linear.factor() == Approx(0.5));
  linear.step();
  CHECK(linear.factor() == Approx(1.0));
  for (int i = 0; i < 4; ++i) linear.step();
  CHECK(linear.factor() == Approx(0.5));  // step 6: (10 - 6) / 8
  CHECK(opt.param_groups()[0].options().get_lr() == Approx(0.5));
  torch::optim::SGD opt2(net->parameters(), torch::optim::SGDOptions(2.0));
  LrScheduler cosine(opt2, LrScheduler::Kind::kCosine, 0, 4);
  cosine.step();
  cosine.step();
  CHECK(cosine.factor() == Approx(0.5));  // halfway: (1 + cos(pi/2)) / 2
  CHECK(opt2.param_groups()[0].options().get_lr() == Approx(1.0));
  CHECK_THROWS_WITH(LrScheduler(opt2, LrScheduler::Kind::kConstant, 5, 4),
                    Catch::Contains("warmup_steps (5) <= total_steps (4)"));
  CHECK_THROWS(LrScheduler::parse("exponential"));
}
