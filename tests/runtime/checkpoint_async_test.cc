// A prepared loader's epochs and resume position, asynchronous saves (the same bytes as
// synchronous ones, committed in time, failures on every rank), and Trainer's checkpoint-<step>
// names saved, pruned and resumed as accelerate's.

#include "checkpoint_job.h"

using namespace cxxlaunch::runtime;
namespace tensorfile = cxxlaunch::tensorfile;
using namespace cxxlaunch::runtime::checkpoint_test;

namespace {

// Example i holds the number i.
struct Numbers : torch::data::datasets::Dataset<Numbers> {
  torch::data::Example<> get(size_t i) override {
    return {torch::full({1}, static_cast<float>(i)), torch::zeros({1})};
  }
  torch::optional<size_t> size() const override { return 21; }
};

// The numbers of each batch a rank draws, over `micro_steps` micro-steps (backward and step each)
// from `load` (a checkpoint, or none), saving at micro-step `save_at` into `save`.
std::vector<std::vector<std::vector<int>>> drawBatches(int micro_steps, const std::string& load,
                                                       int save_at, const std::string& save) {
  auto fake = makeFakeWorld(2);
  std::vector<std::vector<std::vector<int>>> drawn(2);
  onRanks(2, [&](int r) {
    torch::manual_seed(0);
    auto model = torch::nn::Linear(1, 1);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
    World world;
    world.env.rank = r;
    world.env.world_size = 2;
    world.backend = makeFakeBackend(fake, r);
    Accelerator acc(std::move(world), {});
    acc.prepare(model.ptr(), optimizer);
    if (!load.empty()) acc.loadState(load);
    auto loader = acc.prepareDataLoader(Numbers().map(torch::data::transforms::Stack<>()), 4);
    RANK_REQUIRE(loader->batchesPerEpoch() == 3);  // 11 of the 21 (one twice) per rank
    RANK_REQUIRE(loader->paddingExamples() == 1);
    while (static_cast<int>(drawn[r].size()) < micro_steps) {
      for (auto& batch : *loader) {
        std::vector<int> numbers;
        for (int64_t i = 0; i < batch.data.size(0); ++i) {
          numbers.push_back(batch.data[i].item<int>());
        }
        drawn[r].push_back(numbers);
        acc.backward(model->forward(batch.data).sum());
        acc.step();
        if (static_cast<int>(drawn[r].size()) == save_at) acc.saveState(save);
        if (static_cast<int>(drawn[r].size()) == micro_steps) break;
      }
    }
  });
  return drawn;
}

}  // namespace

TEST_CASE("A prepared loader has another order each epoch, the same on every rank, and resumes",
          "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const auto whole = drawBatches(9, "", 4, dir.path() + "/at4");  // epochs 0, 1, 2
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::multiset<int> seen;  // both ranks' numbers: all 21, one of them twice
    std::vector<int> order;
    for (int r = 0; r < 2; ++r) {
      for (int b = 3 * epoch; b < 3 * epoch + 3; ++b) {
        for (int n : whole[r][b]) {
          seen.insert(n);
          if (r == 0) order.push_back(n);
        }
      }
    }
    CHECK(seen.size() == 22);
    CHECK(std::set<int>(seen.begin(), seen.end()).size() == 21);
    if (epoch > 0) {
      std::vector<int> before;
      for (int b = 3 * epoch - 3; b < 3 * epoch; ++b) {
        before.insert(before.end(), whole[0][b].begin(), whole[0][b].end());
      }
      CHECK(order != before);  // reshuffled
    }
  }
  // Saved after micro-step 4 (the second batch of epoch 1): a resumed run draws batches 5 to 9.
  const auto resumed = drawBatches(5, dir.path() + "/at4", -1, "");
  for (int r = 0; r < 2; ++r) {
    CHECK(resumed[r] == std::vector<std::vector<int>>(whole[r].begin() + 4, whole[r].end()));
  }
}

// ---- asynchronous saves (checkpoint/async_save.h) ----------------------------------------------

namespace {

// Every file of a checkpoint directory, by name.
std::map<std::string, std::string> filesOf(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    out[entry.path().filename().string()] = cxxlaunch::testing::readFile(entry.path().string());
  }
  return out;
}

// A rank of a world of two over `fake`, training the Tower with AdamW; `options` as given.
struct AsyncRank {
  Tower net;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<Accelerator> acc;
  int rank;

  AsyncRank(const std::shared_ptr<FakeWorld>& fake, int r, std::mutex& construction,
            AcceleratorOptions options)
      : net([&] {
          std::lock_guard<std::mutex> lock(construction);
          torch::manual_seed(42);
          return Tower(11, 3);
        }()),
        optimizer(makeOptimizer("adamw", net->parameters())),
        rank(r) {
    World world;
    world.env.rank = r;
    world.env.world_size = 2;
    world.env.strategy = "zero3";
    world.env.fsdp_transformer_layer_cls = {"Block"};
    world.env.fsdp_auto_wrap_policy = WrapPolicy::kTransformerBased;
    world.env.checkpoint_async = true;
    world.backend = makeFakeBackend(fake, r);
    acc = std::make_unique<Accelerator>(std::move(world), options);
    acc->prepare(net.ptr(), *optimizer);
  }
  void step() {
    auto [x, y] = batchOf(acc->optimizerSteps(), 8);
    acc->backward(
        torch::mse_loss(net->forward(x.narrow(0, rank * 4, 4)), y.narrow(0, rank * 4, 4)));
    acc->step();
  }
};

}  // namespace

TEST_CASE("Asynchronous saves write the synchronous saves' checkpoints byte for byte",
          "[checkpoint][async]") {
  // Saved at step 2 while training goes on to step 5 (the snapshot must not follow the training),
  // and at the end (committed by the Accelerator's end), in each layout: the files equal a
  // synchronous save's, and the training is not disturbed.
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  for (const std::string layout : {"sharded", "full"}) {
    for (const std::string strategy : {"ddp", "zero1", "zero3"}) {
      INFO(strategy << " " << layout);
      const std::string base = dir.path() + "/" + strategy + "-" + layout;
      auto job = [&](const std::string& mode) {
        Job j{.strategy = strategy, .layout = layout, .async = mode == "async"};
        j.to_step = 5;
        j.save_at = 2;
        j.save_at_dir = base + "/" + mode + "/step2";
        j.save = base + "/" + mode + "/step5";
        return run(j);
      };
      const Ended sync = job("sync"), async = job("async");
      CHECK(maxRelativeDifference(sync, async) == 0);
      for (const std::string step : {"step2", "step5"}) {
        const auto written = filesOf(base + "/async/" + step);
        CHECK(written.size() == 3);  // manifest, rank0.bin, rank1.bin
        CHECK(written == filesOf(base + "/sync/" + step));
        CHECK(!fs::exists(base + "/async/" + step + ".tmp"));
      }
    }
  }
}

TEST_CASE("An asynchronous save is committed by a later step, the next save, a load or the end",
          "[checkpoint][async]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string root = dir.path() + "/checkpoints";
  auto fake = makeFakeWorld(2);
  std::mutex construction;
  std::vector<std::vector<checkpoint::SaveReport>> reports(2);
  onRanks(2, [&](int r) {
    AcceleratorOptions options;
    options.checkpoint_dir = root;
    options.checkpoint_total_limit = 2;
    AsyncRank job(fake, r, construction, options);
    Accelerator& acc = *job.acc;
    for (int s = 1; s <= 6; ++s) {
      job.step();
      acc.saveCheckpoint();
      RANK_REQUIRE(acc.checkpointInFlight());
      // Pruning counts complete checkpoints: never more than the limit, never the newest.
      if (r == 0) {
        const auto complete = tensorfile::complete(root);
        RANK_REQUIRE(complete.size() <= 2);
        if (s > 1) RANK_REQUIRE(complete.front() == root + "/checkpoint_" + std::to_string(s - 1));
      }
      auto mine = acc.takeSaveReports();
      reports[static_cast<size_t>(r)].insert(reports[static_cast<size_t>(r)].end(), mine.begin(),
                                             mine.end());
    }
    // Steps commit the save in flight once every rank's write is over.
    for (int s = 0; s < 2000 && acc.checkpointInFlight(); ++s) {
      job.step();
      if (acc.checkpointInFlight()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    RANK_REQUIRE(!acc.checkpointInFlight());
    auto mine = acc.takeSaveReports();
    reports[static_cast<size_t>(r)].insert(reports[static_cast<size_t>(r)].end(), mine.begin(),
                                           mine.end());
    acc.waitForEveryone();
    if (r == 0) {
      const std::vector<std::string> newest = {root + "/checkpoint_6", root + "/checkpoint_5"};
      RANK_REQUIRE(tensorfile::complete(root) == newest);
    }
    acc.waitForEveryone();
    // A load waits for the save in flight: it is the newest.
    const int64_t steps = acc.optimizerSteps();
    acc.saveCheckpoint();
    RANK_REQUIRE(acc.loadState(root) == root + "/checkpoint_" + std::to_string(steps));
    // The end of the Accelerator commits the last one.
    job.step();
    acc.saveState(dir.path() + "/last");
  });
  CHECK(tensorfile::find(dir.path() + "/last") == dir.path() + "/last");
  for (const auto& mine : reports) {
    REQUIRE(mine.size() == 6);
    for (size_t i = 0; i < mine.size(); ++i) {
      CHECK(mine[i].dir == root + "/checkpoint_" + std::to_string(i + 1));
      CHECK(mine[i].bytes > 0);
      CHECK(mine[i].bytes == mine[0].bytes);  // every rank's files, the same checkpoint each time
      CHECK(mine[i].blocked_seconds <= mine[i].seconds);
    }
  }
}

// HF Trainer names its checkpoints checkpoint-<step> (finetune saves them so); accelerate names
// them checkpoint_<step>. Saving, pruning, finding and resuming treat both alike, mixed too.
TEST_CASE("Trainer's checkpoint-<step> names are saved, pruned and resumed as accelerate's",
          "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string root = dir.path() + "/out";
  // A folder whose only checkpoint is a directory of that name (its manifest never written by a
  // save that died between its renames) still holds one: resuming must not start at step 0.
  const std::string bare = dir.path() + "/bare";
  fs::create_directories(bare + "/checkpoint-7");
  CHECK(tensorfile::holdsCheckpoints(bare));
  std::vector<std::string> skipped;
  CHECK(tensorfile::complete(bare, true, &skipped).empty());
  REQUIRE(skipped.size() == 1);
  CHECK_THAT(skipped[0], Catch::Contains("checkpoint '" + bare + "/checkpoint-7' skipped"));

  auto fake = makeFakeWorld(2);
  std::mutex construction;
  onRanks(2, [&](int r) {
    AcceleratorOptions options;
    options.checkpoint_dir = root;
    options.checkpoint_total_limit = 2;
    options.checkpoint_async = false;
    options.checkpoint_prefix = "checkpoint-";
    AsyncRank job(fake, r, construction, options);
    Accelerator& acc = *job.acc;
    for (int s = 1; s <= 3; ++s) {
      job.step();
      RANK_REQUIRE(acc.saveCheckpoint() == root + "/checkpoint-" + std::to_string(s));
    }
    acc.waitForEveryone();
    if (r == 0) {
      const std::vector<std::string> newest = {root + "/checkpoint-3", root + "/checkpoint-2"};
      RANK_REQUIRE(tensorfile::complete(root) == newest);  // checkpoint-1 pruned
    }
    acc.waitForEveryone();
    job.step();
    RANK_REQUIRE(acc.resume() == root + "/checkpoint-3");
    RANK_REQUIRE(acc.optimizerSteps() == 3);
  });
  // accelerate's spelling in the same folder: the newest step wins whatever its name, and the
  // limit counts both.
  auto again = makeFakeWorld(2);
  onRanks(2, [&](int r) {
    AcceleratorOptions options;
    options.checkpoint_dir = root;
    options.checkpoint_total_limit = 2;
    options.checkpoint_async = false;
    AsyncRank job(again, r, construction, options);
    Accelerator& acc = *job.acc;
    RANK_REQUIRE(acc.resume() == root + "/checkpoint-3");
    job.step();
    RANK_REQUIRE(acc.saveCheckpoint() == root + "/checkpoint_4");
  });
  const std::vector<std::string> mixed = {root + "/checkpoint_4", root + "/checkpoint-3"};
  CHECK(tensorfile::complete(root) == mixed);
  CHECK_FALSE(fs::exists(root + "/checkpoint-2"));

  AcceleratorOptions wrong;
  wrong.checkpoint_prefix = "ckpt-";
  World world;
  world.backend = makeFakeBackend(makeFakeWorld(1), 0);
  CHECK_THROWS_WITH(Accelerator(std::move(world), wrong),
                    Catch::Contains("checkpoint_prefix 'ckpt-' is neither"));
}

TEST_CASE("A background write that fails is an error on every rank, naming the checkpoint",
          "[checkpoint][async]") {
  // The files may not grow past 1 KiB (RLIMIT_FSIZE, SIGXFSZ ignored: the write fails with
  // EFBIG) during the second save, whose snapshot writes no file: its rank files fail in the
  // background.
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string root = dir.path() + "/checkpoints";
  auto fake = makeFakeWorld(2);
  std::mutex construction;
  std::vector<std::string> errors(2);
  const auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit unlimited{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &unlimited) == 0);
  onRanks(2, [&](int r) {
    AsyncRank job(fake, r, construction, {});
    Accelerator& acc = *job.acc;
    job.step();
    acc.saveState(root + "/checkpoint_1");
    acc.waitForCheckpoint();
    job.step();
    acc.waitForEveryone();
    if (r == 0) {
      rlimit small = unlimited;
      small.rlim_cur = 1024;
      RANK_REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    }
    acc.waitForEveryone();
    acc.saveState(root + "/checkpoint_2");  // returns: the snapshot succeeded
    RANK_REQUIRE(acc.checkpointInFlight());
    try {
      for (int s = 0; s < 2000; ++s) {
        job.step();
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      acc.waitForCheckpoint();
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(r)] = e.what();
    }
    acc.waitForEveryone();
    if (r == 0) RANK_REQUIRE(::setrlimit(RLIMIT_FSIZE, &unlimited) == 0);
    acc.waitForEveryone();
    RANK_REQUIRE(!acc.checkpointInFlight());
    // Training goes on, and the next save succeeds.
    job.step();
    acc.saveState(root + "/checkpoint_3");
    acc.waitForCheckpoint();
  });
  std::signal(SIGXFSZ, previous_handler);
  for (const auto& error : errors) {
    CHECK_THAT(error, Catch::Contains("'" + root + "/checkpoint_2' in the background failed") &&
                          Catch::Contains("the previous checkpoint is untouched"));
  }
  // Each rank's own error names its file.
  CHECK_THAT(errors[0] + errors[1], Catch::Contains("rank0.bin") || Catch::Contains("rank1.bin"));
  CHECK(!fs::exists(root + "/checkpoint_2"));
  CHECK(tensorfile::complete(root) ==
        std::vector<std::string>{root + "/checkpoint_3", root + "/checkpoint_1"});
}
