// `cxxlaunch merge-weights`, the real binary on real checkpoints: checkpoints saved by the runtime
// (ranks as threads over the Fake backend, real files) under DDP, ZeRO-3 and FSDP's full layout at
// world 2 are merged into safetensors and read back: fp32 bit for bit the model's parameters and
// buffers, bf16 and fp16 bit for bit as LibTorch rounds them; a small --max_shard_size gives
// several files and an index; bad input is one line and exit 2; peak memory stays bounded.

#include "runtime/checkpoint/merge_weights.h"

#include <torch/torch.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/accelerator.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/safetensors.h"
#include "support/ranks.h"
#include "support/subprocess.h"
#include "tower.h"

using namespace cxxlaunch::runtime;
using cxxlaunch::runtime::testing::Tower;
using cxxlaunch::testing::Finished;
using cxxlaunch::testing::TempDir;
namespace fs = std::filesystem;

namespace {

// The Tower with a float and an integer buffer: merge-weights writes both, converting only the
// float one, as model.to(dtype) does.
struct NetImpl : torch::nn::Module {
  NetImpl() : tower(register_module("tower", Tower(11, 3))) {
    scale = register_buffer("scale", torch::linspace(0.5, 1.5, 3));
    seen = register_buffer("seen", torch::tensor({7, 9}, torch::kLong));
  }
  torch::Tensor forward(const torch::Tensor& x) { return tower->forward(x) * scale; }
  Tower tower;
  torch::Tensor scale, seen;
};
TORCH_MODULE(Net);

using Tensors = std::map<std::string, torch::Tensor>;

// Trains 3 steps at world 2 and saves `dir` (and, after step 1, `first` when given); returns the
// model's parameters (gathered whole) and buffers as they were saved in `dir`.
Tensors trainAndSave(const std::string& strategy, const std::string& layout, const std::string& dir,
                     const std::string& first = "") {
  constexpr int kWorld = 2;
  auto fake = makeFakeWorld(kWorld);
  Tensors saved;
  std::mutex construction;
  cxxlaunch::testing::onRanks(kWorld, [&](int r) {
    Net net = [&] {
      std::lock_guard<std::mutex> lock(construction);
      torch::manual_seed(5);
      return Net();
    }();
    torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(0.01));
    World world;
    world.env.rank = r;
    world.env.world_size = kWorld;
    world.env.strategy = strategy;
    world.env.fsdp_transformer_layer_cls = {"Block"};
    world.env.fsdp_auto_wrap_policy = WrapPolicy::kTransformerBased;
    world.env.state_dict_type = layout == "full" ? StateDictType::kFull : StateDictType::kSharded;
    world.backend = makeFakeBackend(fake, r);
    Accelerator acc(std::move(world), {});
    acc.prepare(net.ptr(), optimizer);
    auto gen = at::detail::createCPUGenerator(11);
    for (int step = 0; step < 3; ++step) {
      const auto x = torch::randn({4, 6}, gen), y = torch::randn({4, 3}, gen);
      acc.backward(torch::mse_loss(net->forward(x.narrow(0, 2 * r, 2)), y.narrow(0, 2 * r, 2)));
      RANK_REQUIRE(acc.step());
      if (step == 0 && !first.empty()) acc.saveState(first);
    }
    acc.saveState(dir);
    auto params = acc.fullParameters();
    if (r == 0) {
      for (auto& [name, tensor] : params) saved[name] = tensor.clone();
      for (const auto& item : net->named_buffers()) saved[item.key()] = item.value().clone();
    }
  });
  return saved;
}

Finished mergeWeights(std::vector<std::string> args) {
  args.insert(args.begin(), {CXXLAUNCH_BIN, "merge-weights"});
  return cxxlaunch::testing::run(args, {}, std::chrono::seconds(120));
}

Tensors readBack(const std::string& dir) {
  Tensors out;
  checkpoint::readSafetensors(
      dir, [&](const std::string& name, const torch::Tensor& t) { out[name] = t.clone(); });
  return out;
}

// Bit for bit: the same dtype, shape and bytes.
bool sameBits(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const auto ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.nbytes()) == 0;
}

// What merge-weights must write in `dtype`: floating tensors as LibTorch converts them.
void checkMerged(const Tensors& model, const Tensors& merged, torch::ScalarType dtype) {
  REQUIRE(merged.size() == model.size());
  for (const auto& [name, tensor] : model) {
    INFO(name);
    REQUIRE(merged.count(name) == 1);
    const auto expected = tensor.is_floating_point() ? tensor.to(dtype) : tensor;
    CHECK(sameBits(merged.at(name), expected));
  }
}

// The error line merge-weights printed, and that it is the only one.
std::string oneErrorLine(const Finished& f) {
  INFO(f.err);
  CHECK(f.exit_code == 2);
  CHECK(std::count(f.err.begin(), f.err.end(), '\n') == 1);
  CHECK(f.err.rfind("cxxlaunch merge-weights: error: ", 0) == 0);
  return f.err;
}

}  // namespace

TEST_CASE("merge-weights writes the model of DDP, ZeRO-3 and full-layout checkpoints bit for bit",
          "[merge_weights]") {
  torch::set_num_threads(1);
  TempDir dir;
  struct Case {
    std::string strategy, layout;
  };
  for (const Case& c :
       {Case{"ddp", "sharded"}, Case{"zero3", "sharded"}, Case{"fsdp_full_shard", "full"}}) {
    INFO(c.strategy << " " << c.layout);
    const std::string base = dir.path() + "/" + c.strategy;
    const Tensors model = trainAndSave(c.strategy, c.layout, base + "/ckpt/checkpoint_3",
                                       base + "/ckpt/checkpoint_1");
    for (const auto& [flag, dtype] :
         {std::pair{"fp32", torch::kFloat}, std::pair{"bf16", torch::kBFloat16},
          std::pair{"fp16", torch::kHalf}}) {
      INFO(flag);
      const std::string out = base + "/" + flag;
      const Finished f =
          mergeWeights({base + "/ckpt/checkpoint_3", out, "--dtype", std::string(flag)});
      INFO(f.err);
      REQUIRE(f.exit_code == 0);
      CHECK(fs::exists(out + "/model.safetensors"));
      CHECK(!fs::exists(out + "/model.safetensors.index.json"));
      checkMerged(model, readBack(out), dtype);
    }
    // A folder of checkpoints: the newest complete one (step 3, not step 1).
    const Finished f = mergeWeights({base + "/ckpt", base + "/folder"});
    REQUIRE(f.exit_code == 0);
    CHECK(f.out.find("checkpoint_3") != std::string::npos);
    checkMerged(model, readBack(base + "/folder"), torch::kFloat);
    // Above --max_shard_size: several files and the index; the folder reads as one model.
    const Finished sharded = mergeWeights(
        {base + "/ckpt", base + "/sharded", "--max_shard_size", "400B", "--dtype", "bf16"});
    REQUIRE(sharded.exit_code == 0);
    CHECK(fs::exists(base + "/sharded/model.safetensors.index.json"));
    CHECK(!fs::exists(base + "/sharded/model.safetensors"));
    size_t files = 0;
    for (const auto& e : fs::directory_iterator(base + "/sharded")) {
      files += e.path().extension() == ".safetensors";
    }
    CHECK(files > 2);
    checkMerged(model, readBack(base + "/sharded"), torch::kBFloat16);
  }
}

TEST_CASE("merge-weights refuses a missing, incomplete or corrupt checkpoint and a full output",
          "[merge_weights]") {
  torch::set_num_threads(1);
  TempDir dir;
  const std::string ckpt = dir.path() + "/ckpt";
  trainAndSave("ddp", "sharded", ckpt);
  const std::string out = dir.path() + "/out";

  CHECK(oneErrorLine(mergeWeights({dir.path() + "/nothing", out})).find("does not exist") !=
        std::string::npos);

  // No manifest: the save never finished.
  fs::copy(ckpt, dir.path() + "/unfinished");
  fs::remove(dir.path() + "/unfinished/manifest");
  CHECK(oneErrorLine(mergeWeights({dir.path() + "/unfinished", out})).find("manifest") !=
        std::string::npos);

  // A rank file cut short.
  fs::copy(ckpt, dir.path() + "/short");
  fs::resize_file(dir.path() + "/short/rank1.bin", fs::file_size(ckpt + "/rank1.bin") - 100);
  CHECK(oneErrorLine(mergeWeights({dir.path() + "/short", out})).find("rank1.bin") !=
        std::string::npos);

  // One flipped byte in a parameter's data in rank 1's file: its checksum names the file.
  fs::copy(ckpt, dir.path() + "/flipped");
  const std::string victim = dir.path() + "/flipped/rank1.bin";
  uint64_t at = 0;
  {
    const checkpoint::ShardFileReader file(victim);
    REQUIRE(!file.slices().empty());
    at = file.slices().front().arrays.front().second + 5;
  }
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    const char byte = static_cast<char>(f.get() ^ 0x10);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(byte);
  }
  const std::string corrupt = oneErrorLine(mergeWeights({dir.path() + "/flipped", out}));
  CHECK(corrupt.find(victim) != std::string::npos);
  CHECK(corrupt.find("checksum") != std::string::npos);
  CHECK(!fs::exists(out));  // nothing half-done, and no staging left beside it
  for (const auto& e : fs::directory_iterator(dir.path())) {
    CHECK(e.path().filename().string().find(".merge-") == std::string::npos);
  }

  // An output that is not empty: refused and untouched, unless --overwrite.
  fs::create_directories(out);
  { std::ofstream(out + "/mine.txt") << "keep"; }
  CHECK(oneErrorLine(mergeWeights({ckpt, out})).find("--overwrite") != std::string::npos);
  CHECK(cxxlaunch::testing::readFile(out + "/mine.txt") == "keep");
  REQUIRE(mergeWeights({ckpt, out, "--overwrite"}).exit_code == 0);
  CHECK(!fs::exists(out + "/mine.txt"));
  CHECK(fs::exists(out + "/model.safetensors"));
  // A crash between a save's two renames leaves `<dir>.old`: merged as loadState would load it.
  fs::copy(ckpt, dir.path() + "/crashed.old");
  const Finished old = mergeWeights({dir.path() + "/crashed", dir.path() + "/from-old"});
  CHECK(old.exit_code == 0);
  CHECK(old.out.find("crashed.old") != std::string::npos);
  // An empty folder is no obstacle.
  fs::create_directories(dir.path() + "/empty");
  CHECK(mergeWeights({ckpt, dir.path() + "/empty"}).exit_code == 0);

  CHECK(oneErrorLine(mergeWeights({ckpt, out, "--overwrite", "--dtype", "fp8"})).find("--dtype") !=
        std::string::npos);
  CHECK(oneErrorLine(mergeWeights({ckpt, out, "--overwrite", "--max_shard_size", "5XB"}))
            .find("--max_shard_size") != std::string::npos);
}

TEST_CASE("merge-weights streams: its peak memory stays under twice the largest tensor + 64 MiB",
          "[merge_weights]") {
  TempDir dir;
  auto fake = makeFakeWorld(1);
  auto backend = makeFakeBackend(fake, 0);
  // One checkpoint with a 128 MiB tensor, one with a tiny one: the second is the binary's own
  // baseline, so that the bound is on what merging adds.
  constexpr int64_t kBig = int64_t{32} << 20;  // float32 elements
  auto save = [&](const std::string& path, int64_t numel) {
    StateView slice{"big.weight", {numel / 1024, 1024}, 0, numel, {}};
    slice.arrays.emplace_back("param", torch::arange(numel, torch::kFloat));
    slice.arrays.emplace_back("exp_avg", torch::ones({numel}));
    checkpoint::save(*backend, path, streamOf({slice}), {}, {{"optimizer_steps", "1"}});
  };
  save(dir.path() + "/big", kBig);
  save(dir.path() + "/tiny", 1024);
  auto peakKiB = [&](const std::string& from, const std::string& dtype) {
    const std::string out = dir.path() + "/out-" + fs::path(from).filename().string() + dtype;
    const Finished f = cxxlaunch::testing::run(
        {"/usr/bin/time", "-f", "%M", CXXLAUNCH_BIN, "merge-weights", from, out, "--dtype", dtype},
        {}, std::chrono::seconds(120));
    INFO(f.err);
    REQUIRE(f.exit_code == 0);
    const std::string last = f.err.substr(f.err.find_last_of('\n', f.err.size() - 2) + 1);
    return std::stoll(last);
  };
  for (const std::string dtype : {"fp32", "bf16"}) {
    const long long baseline = peakKiB(dir.path() + "/tiny", dtype);
    const long long big = peakKiB(dir.path() + "/big", dtype);
    const long long bound = 2 * (kBig * 4 / 1024) + 64 * 1024;
    WARN("merge-weights " << dtype << " peak RSS: " << big << " KiB for a " << kBig * 4 / 1048576
                          << " MiB tensor, " << baseline << " KiB for a tiny one");
    CHECK(big - baseline < bound);
  }
  // And what it wrote is the tensor.
  const Tensors merged = readBack(dir.path() + "/out-bigfp32");
  CHECK(sameBits(merged.at("big.weight"),
                 torch::arange(kBig, torch::kFloat).reshape({kBig / 1024, 1024})));
}

TEST_CASE("merge-weights rounds to bf16 and fp16 as LibTorch does", "[merge_weights]") {
  // Every class of float: random bits (normals, subnormals, infinities), and the halfway cases.
  auto gen = at::detail::createCPUGenerator(3);
  auto bits = torch::randint(0, int64_t{1} << 32, {1 << 20}, gen, torch::kLong).to(torch::kInt);
  auto values = bits.view(torch::kFloat);
  values = values.masked_fill(values.isnan(), 1.5f);  // NaN payloads: c10's scalar and vector
                                                      // paths differ, so not compared
  const auto bf16 = values.to(torch::kBFloat16), half = values.to(torch::kHalf);
  const auto widened = half.to(torch::kFloat);  // F16 buffers are read back through it
  const float* v = values.data_ptr<float>();
  const float* w = widened.data_ptr<float>();
  int64_t bf16_wrong = 0, half_wrong = 0, back_wrong = 0;
  for (int64_t i = 0; i < values.numel(); ++i) {
    uint16_t b, h;
    std::memcpy(&b, static_cast<const char*>(bf16.data_ptr()) + 2 * i, 2);
    std::memcpy(&h, static_cast<const char*>(half.data_ptr()) + 2 * i, 2);
    bf16_wrong += checkpoint::floatToBFloat16(v[i]) != b;
    half_wrong += checkpoint::floatToHalf(v[i]) != h;
    const float back = checkpoint::halfToFloat(h);
    back_wrong += std::memcmp(&back, w + i, 4) != 0;
  }
  CHECK(bf16_wrong == 0);
  CHECK(half_wrong == 0);
  CHECK(back_wrong == 0);
  CHECK(checkpoint::parseByteSize("5GB") == 5'000'000'000ULL);
  CHECK(checkpoint::parseByteSize("500MB") == 500'000'000ULL);
  CHECK(checkpoint::parseByteSize("10GiB") == 10ULL << 30);
  CHECK(checkpoint::parseByteSize("4096") == 4096);
  CHECK(checkpoint::parseByteSize("1.5kb") == 1500);
  for (const std::string bad : {"", "GB", "0", "5 GB", "-1", "5XB", "1e3"}) {
    CHECK_THROWS_AS(checkpoint::parseByteSize(bad), cxxlaunch::InvalidArgument);
  }
}
