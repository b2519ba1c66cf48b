// Checkpoints (runtime/checkpoint/): a run saved at step k and resumed in a fresh job ends bit for
// bit where the uninterrupted run ends, in every strategy, fp32 and bf16, with every torch::optim
// optimizer; a checkpoint loads at another world size and in another strategy. Ranks are threads
// over the Fake backend; the files are real (checkpoint_job.h). The other checkpoint tests:
// checkpoint_discovery_test.cc (folders, manifests), checkpoint_corruption_test.cc (damaged and
// crafted files), checkpoint_export_test.cc (safetensors, CRC-32C, acc.save),
// checkpoint_async_test.cc (loaders, asynchronous saves, names).

#include "checkpoint_job.h"

using namespace cxxlaunch::runtime;
namespace tensorfile = cxxlaunch::tensorfile;
using namespace cxxlaunch::runtime::checkpoint_test;

TEST_CASE("A resumed job ends bit for bit where the uninterrupted one ends", "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  int case_id = 0;
  for (const std::string precision : {"no", "bf16"}) {
    for (const std::string optimizer : {"adamw", "sgd"}) {
      for (const std::string strategy : {"ddp", "zero1", "zero2", "zero3", "fsdp_full_shard",
                                         "fsdp_shard_grad_op", "fsdp_no_shard"}) {
        INFO(strategy << " " << optimizer << " " << precision);
        const std::string base = dir.path() + "/" + std::to_string(case_id++);
        Job whole{.strategy = strategy, .optimizer = optimizer, .precision = precision};
        whole.save_at = 2;
        whole.save_at_dir = base + "/step2";
        whole.save = base + "/uninterrupted";
        const Ended uninterrupted = run(whole);  // steps 0-3, saved after step 2 and at the end
        Job resumed = whole;
        resumed.from_step = 2;
        resumed.load = base + "/step2";
        resumed.save_at = -1;
        resumed.seed = 7;  // other initial weights: all of them must come from the checkpoint
        resumed.save = base + "/resumed";
        const Ended again = run(resumed);
        CHECK(again.loaded == base + "/step2");
        CHECK(again.optimizer_steps == 4);
        CHECK(again.lr == uninterrupted.lr);
        CHECK(maxRelativeDifference(again, uninterrupted) == 0);
        // Parameters, optimizer state, counters, generators: the files agree byte for byte.
        for (const std::string file : {"manifest", "rank0.bin", "rank1.bin"}) {
          CHECK(sameBytes(base + "/resumed/" + file, base + "/uninterrupted/" + file));
        }
      }
    }
  }
}

TEST_CASE("DDP resumes the state of every torch::optim optimizer bit for bit", "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  int case_id = 0;
  for (const std::string optimizer : {"adamw_amsgrad", "adam_amsgrad", "rmsprop", "adagrad"}) {
    for (const std::string strategy : {"ddp", "fsdp_no_shard"}) {
      for (const std::string layout : {"sharded", "full"}) {
        INFO(optimizer << " " << strategy << " " << layout);
        const std::string base = dir.path() + "/" + std::to_string(case_id++);
        Job whole{.strategy = strategy, .optimizer = optimizer, .layout = layout};
        whole.save_at = 2;
        whole.save_at_dir = base + "/step2";
        whole.save = base + "/uninterrupted";
        const Ended uninterrupted = run(whole);
        Job resumed = whole;
        resumed.from_step = 2;
        resumed.load = base + "/step2";
        resumed.save_at = -1;
        resumed.seed = 7;
        resumed.save = base + "/resumed";
        CHECK(maxRelativeDifference(run(resumed), uninterrupted) == 0);
        for (const std::string file : {"rank0.bin", "rank1.bin"}) {
          CHECK(sameBytes(base + "/resumed/" + file, base + "/uninterrupted/" + file));
        }
        // One process: DDP's state is whole on every rank.
        resumed.world = 1;
        resumed.save = "";
        CHECK(maxRelativeDifference(run(resumed), uninterrupted) < 1e-6);
      }
    }
  }
}

TEST_CASE("A roll-back in a job that has stepped reads into the memory it has and goes on exactly",
          "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  int case_id = 0;
  for (const std::string optimizer : {"adamw", "sgd"}) {
    for (const std::string strategy : {"ddp", "fsdp_no_shard", "zero1", "zero3"}) {
      INFO(strategy << " " << optimizer);
      const std::string base = dir.path() + "/" + std::to_string(case_id++);
      Job whole{.strategy = strategy, .optimizer = optimizer};
      whole.save_at = 2;
      whole.save_at_dir = base + "/step2";
      const Ended uninterrupted = run(whole);
      Job rolled = whole;
      rolled.save_at = -1;
      rolled.roll_back = base + "/step2";  // steps 0-3, back to 2, steps 2-3 again
      const Ended again = run(rolled);
      CHECK(again.optimizer_steps == 4);
      CHECK(maxRelativeDifference(again, uninterrupted) == 0);
      // DDP's state is torch::optim's (ZeRO's and FSDP's sharded state lives in the strategy).
      CHECK(again.state_moved == 0);
      if (strategy == "ddp" || strategy == "fsdp_no_shard") CHECK(again.state_kept > 0);
    }
  }
}

// A head that joins the model only from optimizer step 2 on: until then it has no gradient, and
// torch's AdamW does not step it.
struct LateHeadImpl : torch::nn::Module {
  LateHeadImpl()
      : base(register_module("base", torch::nn::Linear(6, 3))),
        late(register_module("late", torch::nn::Linear(6, 3))) {}
  torch::Tensor forward(const torch::Tensor& x, int64_t step) {
    return step >= 2 ? base(x) + late(x) : base(x);
  }
  torch::nn::Linear base, late;
};
TORCH_MODULE(LateHead);

TEST_CASE("A parameter torch stepped less often than the job resumes with its own step count",
          "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  // Steps [from, 6) at world 2 under DDP; saves after step 4 to `save`; rank 0's parameters.
  auto job = [&](const std::string& layout, int64_t from, const std::string& load,
                 const std::string& save, int64_t seed) {
    auto fake = makeFakeWorld(2);
    std::mutex construction;
    std::map<std::string, torch::Tensor> params;
    onRanks(2, [&](int r) {
      LateHead net = [&] {
        std::lock_guard<std::mutex> lock(construction);
        torch::manual_seed(seed);
        return LateHead();
      }();
      torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(0.01));
      World world;
      world.env.rank = r;
      world.env.world_size = 2;
      world.env.state_dict_type = stateDictType(layout);
      world.backend = makeFakeBackend(fake, r);
      AcceleratorOptions options;
      options.find_unused_parameters = true;
      Accelerator acc(std::move(world), options);
      acc.prepare(net.ptr(), optimizer);
      if (!load.empty()) acc.loadState(load);
      RANK_REQUIRE(acc.optimizerSteps() == from);
      for (int64_t s = from; s < 6; ++s) {
        auto [x, y] = batchOf(s, 4);
        acc.backward(
            torch::mse_loss(net->forward(x.narrow(0, 2 * r, 2), s), y.narrow(0, 2 * r, 2)));
        RANK_REQUIRE(acc.step());
        if (s + 1 == 4 && !save.empty()) acc.saveState(save);
      }
      if (r == 0) {
        for (const auto& item : net->named_parameters()) {
          params[item.key()] = item.value().detach().clone();
        }
      }
    });
    return params;
  };
  for (const std::string layout : {"sharded", "full"}) {
    INFO(layout);
    const std::string saved = dir.path() + "/" + layout;
    const auto uninterrupted = job(layout, 0, "", saved, 42);
    const tensorfile::Reader reader(saved);
    CHECK(reader.counter("step:late.weight") == "2");  // steps 2 and 3 of the job's 4
    CHECK_FALSE(reader.counter("step:base.weight"));   // as many as the job's: not written
    const auto resumed = job(layout, 4, saved, "", 7);
    REQUIRE(resumed.size() == uninterrupted.size());
    for (const auto& [name, value] : uninterrupted) {
      INFO(name);
      CHECK(torch::equal(resumed.at(name), value));
    }
  }
}

TEST_CASE("Learning rates set by hand resume with the checkpoint", "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  for (const std::string strategy : {"ddp", "zero2", "zero3"}) {
    INFO(strategy);
    const std::string saved = dir.path() + "/" + strategy;
    // Two parameter groups, no LrScheduler: the trainer decays the rates itself.
    auto job = [&](bool save, std::vector<double>& lrs) {
      auto fake = makeFakeWorld(2);
      std::mutex construction;
      onRanks(2, [&](int r) {
        Tower net = [&] {
          std::lock_guard<std::mutex> lock(construction);
          torch::manual_seed(42);
          return Tower(11, 2);
        }();
        std::vector<torch::Tensor> first, rest;
        for (auto& item : net->named_parameters()) {
          (item.key().rfind("in.", 0) == 0 ? first : rest).push_back(item.value());
        }
        torch::optim::AdamW optimizer(
            {torch::optim::OptimizerParamGroup(first,
                                               std::make_unique<torch::optim::AdamWOptions>(0.01)),
             torch::optim::OptimizerParamGroup(rest)},
            torch::optim::AdamWOptions(0.02));
        World world;
        world.env.rank = r;
        world.env.world_size = 2;
        world.env.strategy = strategy;
        world.env.fsdp_transformer_layer_cls = {"Block"};
        world.env.fsdp_auto_wrap_policy = WrapPolicy::kTransformerBased;
        world.backend = makeFakeBackend(fake, r);
        Accelerator acc(std::move(world), {});
        acc.prepare(net.ptr(), optimizer);
        if (save) {
          auto [x, y] = batchOf(0, 4);
          acc.backward(torch::mse_loss(net->forward(x.narrow(0, 2 * r, 2)), y.narrow(0, 2 * r, 2)));
          RANK_REQUIRE(acc.step());
          for (auto& group : optimizer.param_groups()) {
            group.options().set_lr(group.options().get_lr() / 3);
          }
          acc.saveState(saved);
        } else {
          acc.loadState(saved);
        }
        if (r == 1) {
          for (auto& group : optimizer.param_groups()) lrs.push_back(group.options().get_lr());
        }
      });
    };
    std::vector<double> at_save, loaded;
    job(true, at_save);
    job(false, loaded);
    REQUIRE(at_save.size() == 2);
    CHECK(at_save[0] == 0.01 / 3);
    CHECK(at_save[1] == 0.02 / 3);
    CHECK(loaded == at_save);  // bit for bit
  }
}

TEST_CASE("saveState refuses an optimizer whose state it cannot keep and writes nothing",
          "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  for (const std::string layout : {"sharded", "full"}) {
    INFO(layout);
    const std::string target = dir.path() + "/" + layout;
    Job job{.optimizer = "own", .to_step = 2, .save = target, .layout = layout};
    std::string message;
    try {
      run(job);
    } catch (const cxxlaunch::InvalidArgument& e) {
      message = e.what();
    }
    CHECK_THAT(message, Catch::Contains("not this optimizer's") && Catch::Contains("acc.save"));
    CHECK_FALSE(fs::exists(target));
    CHECK(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()) == 0);
  }
}

TEST_CASE("The full layout has every parameter whole in rank 0's file and resumes exactly",
          "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  int case_id = 0;
  for (const std::string precision : {"no", "bf16"}) {
    for (const std::string strategy : {"ddp", "zero1", "zero2", "zero3", "fsdp_full_shard"}) {
      INFO(strategy << " " << precision);
      const std::string base = dir.path() + "/" + std::to_string(case_id++);
      Job whole{.strategy = strategy, .precision = precision, .layout = "full"};
      whole.save_at = 2;
      whole.save_at_dir = base + "/step2";
      const Ended uninterrupted = run(whole);
      const tensorfile::ShardFileReader first(base + "/step2/rank0.bin"),
          second(base + "/step2/rank1.bin");
      CHECK(second.slices().empty());  // rank 1 keeps only its generator state
      CHECK(second.hasBlob("rng_cpu"));
      std::set<std::string> whole_params;
      for (const auto& slice : first.slices()) {
        CHECK(slice.begin == 0);
        int64_t numel = 1;
        for (int64_t d : slice.shape) numel *= d;
        CHECK(slice.end == numel);
        whole_params.insert(slice.param);
      }
      CHECK(whole_params.size() == uninterrupted.params.size());
      Job resumed = whole;
      resumed.from_step = 2;
      resumed.load = base + "/step2";
      resumed.save_at = -1;
      resumed.seed = 7;
      CHECK(maxRelativeDifference(run(resumed), uninterrupted) == 0);
      // A full checkpoint loads into another strategy at another world size.
      Job elsewhere = resumed;
      elsewhere.strategy = strategy == "zero3" ? "zero2" : "zero3";
      elsewhere.world = 4;
      elsewhere.layout = "sharded";
      CHECK(maxRelativeDifference(run(elsewhere), uninterrupted) <
            (precision == "no" ? 1e-5 : 2e-2));
    }
  }
}

TEST_CASE("nvme offload's state is in its checkpoints, and loads back to disk or memory",
          "[checkpoint]") {
  torch::set_num_threads(1);
  for (const std::string layout : {"sharded", "full"}) {  // full: gathered from nvme's buffers
    INFO(layout);
    cxxlaunch::testing::TempDir dir;
    const std::string swap = dir.path() + "/swap";
    fs::create_directory(swap);
    Job whole{.strategy = "zero3",
              .save_at = 2,
              .save_at_dir = dir.path() + "/step2",
              .nvme = swap,
              .layout = layout};
    whole.save = dir.path() + "/uninterrupted";
    const Ended uninterrupted = run(whole);
    Job resumed = whole;
    resumed.from_step = 2;
    resumed.load = dir.path() + "/step2";
    resumed.save_at = -1;
    resumed.save = dir.path() + "/resumed";
    resumed.seed = 7;
    CHECK(maxRelativeDifference(run(resumed), uninterrupted) == 0);
    CHECK(sameBytes(dir.path() + "/resumed/rank0.bin", dir.path() + "/uninterrupted/rank0.bin"));
    CHECK(sameBytes(dir.path() + "/resumed/rank1.bin", dir.path() + "/uninterrupted/rank1.bin"));
    resumed.nvme = "";  // the same checkpoint, in memory this time
    resumed.save = "";
    CHECK(maxRelativeDifference(run(resumed), uninterrupted) < 1e-6);
  }
}

TEST_CASE("A checkpoint resumes at another world size and in another strategy", "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  for (const std::string optimizer : {"adamw", "sgd"}) {
    INFO(optimizer);
    // Never resharded: ZeRO-3 at world 4 for 8 steps.
    const Ended reference =
        run(Job{.strategy = "zero3", .world = 4, .optimizer = optimizer, .to_step = 8});
    // 4 -> 2 -> 1 -> 4, changing strategy on the way, two steps each.
    const std::string at = dir.path() + "/" + optimizer;
    run(Job{
        .strategy = "zero3", .world = 4, .optimizer = optimizer, .to_step = 2, .save = at + "/a"});
    run(Job{.strategy = "zero2",
            .world = 2,
            .optimizer = optimizer,
            .from_step = 2,
            .to_step = 4,
            .load = at + "/a",
            .save = at + "/b"});
    run(Job{.strategy = "ddp",
            .world = 1,
            .optimizer = optimizer,
            .from_step = 4,
            .to_step = 6,
            .load = at + "/b",
            .save = at + "/c"});
    const Ended resharded = run(Job{.strategy = "fsdp_full_shard",
                                    .world = 4,
                                    .optimizer = optimizer,
                                    .from_step = 6,
                                    .to_step = 8,
                                    .load = at + "/c"});
    CHECK(maxRelativeDifference(resharded, reference) < 1e-5);
  }
}
