// `cxxlaunch merge-weights`, the real binary on real checkpoints: checkpoints saved by the runtime
// (ranks as threads over the Fake backend, real files) under DDP, ZeRO-3 and FSDP's full layout at
// world 2 are merged into safetensors and read back: fp32 bit for bit the model's parameters and
// buffers, bf16 and fp16 bit for bit as LibTorch rounds them; a small --max_shard_size gives
// several files and an index; bad input is one line and exit 2; peak memory stays bounded.

#include "tensorfile/merge_weights.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "models/llama.h"
#include "runtime/accelerator.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/world.h"
#include "support/ranks.h"
#include "support/subprocess.h"
#include "tower.h"

using namespace cxxlaunch::runtime;
namespace tensorfile = cxxlaunch::tensorfile;
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
    const tensorfile::ShardFileReader file(victim);
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
    bf16_wrong += tensorfile::floatToBFloat16(v[i]) != b;
    half_wrong += tensorfile::floatToHalf(v[i]) != h;
    const float back = tensorfile::halfToFloat(h);
    back_wrong += std::memcmp(&back, w + i, 4) != 0;
  }
  CHECK(bf16_wrong == 0);
  CHECK(half_wrong == 0);
  CHECK(back_wrong == 0);
  CHECK(tensorfile::parseByteSize("5GB") == 5'000'000'000ULL);
  CHECK(tensorfile::parseByteSize("500MB") == 500'000'000ULL);
  CHECK(tensorfile::parseByteSize("10GiB") == 10ULL << 30);
  CHECK(tensorfile::parseByteSize("4096") == 4096);
  CHECK(tensorfile::parseByteSize("1.5kb") == 1500);
  for (const std::string bad : {"", "GB", "0", "5 GB", "-1", "5XB", "1e3"}) {
    CHECK_THROWS_AS(tensorfile::parseByteSize(bad), cxxlaunch::InvalidArgument);
  }
}

namespace {

// Every file under `root` (links not followed) with its bytes, and every folder: what a refused
// merge must leave as it was.
std::map<std::string, std::string> tree(const std::string& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    const std::string path = e.path().string();
    if (e.is_symlink()) {
      out[path] = "-> " + fs::read_symlink(e.path()).string();
    } else if (e.is_regular_file()) {
      out[path] = cxxlaunch::testing::readFile(path);
    } else {
      out[path] = "<folder>";
    }
  }
  return out;
}

}  // namespace

TEST_CASE("merge-weights refuses an output that is, contains or lies inside the checkpoint",
          "[merge_weights]") {
  torch::set_num_threads(1);
  TempDir dir;
  const std::string ck = dir.path() + "/ck9", ck3 = ck + "/checkpoint_3";
  trainAndSave("ddp", "sharded", ck3, ck + "/checkpoint_1");
  fs::create_directory_symlink(ck, dir.path() + "/link");
  fs::create_directory_symlink(ck3, dir.path() + "/link3");
  const auto before = tree(dir.path());
  const std::vector<std::vector<std::string>> refused = {
      {ck3, ck, "--overwrite"},                    // the issue's: the folder of checkpoints
      {ck3, ck3, "--overwrite"},                   // the checkpoint itself
      {ck3, ck + "/", "--overwrite"},              // a trailing slash
      {ck3, ck3 + "/../", "--overwrite"},          // `..`
      {ck3, ck3 + "/merged"},                      // inside it, not there yet
      {ck3, dir.path() + "/link", "--overwrite"},  // a link to the folder
      {ck3, dir.path() + "/link3/new"},            // inside it through a link
      {ck3, dir.path(), "--overwrite"},            // far above it
      {ck, ck + "/checkpoint_1", "--overwrite"},   // another checkpoint of the folder named
      {dir.path() + "/link", ck3 + "/x"},          // the input through a link
  };
  for (const auto& args : refused) {
    INFO(args[0] << " -> " << args[1]);
    const std::string line = oneErrorLine(mergeWeights(args));
    CHECK(line.find("merge-weights never writes where it reads") != std::string::npos);
    CHECK(line.find(args[1]) != std::string::npos);
    CHECK(tree(dir.path()) == before);
  }
  // Beside it is fine.
  const Finished beside = mergeWeights({ck3, ck + "/../merged"});
  INFO(beside.err);
  CHECK(beside.exit_code == 0);
  CHECK(fs::exists(dir.path() + "/merged/model.safetensors"));
}

namespace {

// A process id that no process has: a child that has exited and been reaped.
pid_t deadPid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

// A leftover folder `.<output>.merge-<pid>[suffix]` beside `output`, holding a file.
std::string leftover(const std::string& output, pid_t pid, const std::string& suffix = "") {
  const fs::path out(output);
  const std::string path = (out.parent_path() / ("." + out.filename().string() + ".merge-" +
                                                 std::to_string(pid) + suffix))
                               .string();
  fs::create_directories(path);
  std::ofstream(path + "/model.safetensors") << "half-written";
  return path;
}

// Waits until process `pid` runs a program whose command line holds `word`.
bool runs(pid_t pid, const std::string& word) {
  return cxxlaunch::testing::eventually(
      [&] {
        std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline");
        const std::string text{std::istreambuf_iterator<char>(in), {}};
        return text.find(word) != std::string::npos;
      },
      std::chrono::seconds(10));
}

}  // namespace

TEST_CASE("merge-weights removes what killed merges into its output left, and nothing else",
          "[merge_weights]") {
  torch::set_num_threads(1);
  TempDir dir;
  const std::string ckpt = dir.path() + "/ckpt", out = dir.path() + "/out";
  trainAndSave("ddp", "sharded", ckpt);
  const pid_t dead = deadPid();
  const std::string staged = leftover(out, dead), aside = leftover(out, dead, ".old");
  const std::string other = leftover(dir.path() + "/other", dead);  // another output's
  // A process id reused by a program that is no merge: its leftover is over too.
  cxxlaunch::testing::Subprocess sleeper({"/bin/sleep", "60"});
  REQUIRE(runs(sleeper.pid(), "sleep"));
  const std::string reused = leftover(out, sleeper.pid());
  // A merge that runs (its command line says merge-weights): left alone.
  cxxlaunch::testing::Subprocess merging({"/bin/sh", "-c", "sleep 60; exit 0", "merge-weights"});
  REQUIRE(runs(merging.pid(), "merge-weights"));
  const std::string running = leftover(out, merging.pid());
  // A staging folder whose lock is held: a merge runs there, whatever its id says.
  const std::string held = leftover(out, deadPid());
  const int fd = ::open(held.c_str(), O_RDONLY | O_DIRECTORY);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX) == 0);

  // A merge that fails (a corrupt checkpoint) removes the dead staging folders, but keeps an
  // aside while no output is in place: it may be the only copy of the output it replaced.
  const std::string corrupt = dir.path() + "/corrupt";
  fs::copy(ckpt, corrupt);
  {  // one byte of a parameter flipped: found only while reading, after the leftovers' check
    uint64_t at = 0;
    {
      const tensorfile::ShardFileReader file(corrupt + "/rank1.bin");
      REQUIRE(!file.slices().empty());
      at = file.slices().front().arrays.front().second + 5;
    }
    std::string bytes = cxxlaunch::testing::readFile(corrupt + "/rank1.bin");
    bytes[at] = static_cast<char>(bytes[at] ^ 0x10);
    std::ofstream(corrupt + "/rank1.bin", std::ios::binary | std::ios::trunc) << bytes;
  }
  const Finished failed = mergeWeights({corrupt, out});
  CHECK(failed.exit_code == 2);
  CHECK(!fs::exists(staged));
  CHECK(fs::exists(aside));
  CHECK(!fs::exists(out));

  const Finished f = mergeWeights({ckpt, out});
  INFO(f.err);
  REQUIRE(f.exit_code == 0);
  CHECK(fs::exists(out + "/model.safetensors"));
  CHECK(!fs::exists(aside));   // the output is in place now
  CHECK(!fs::exists(reused));  // its id runs another program
  CHECK(fs::exists(running));  // a merge may still be writing it
  CHECK(fs::exists(held));     // locked
  CHECK(fs::exists(other));    // not this output's
  CHECK(f.err.find("removed '" + aside + "'") != std::string::npos);
  ::close(fd);
  // Released, and its process gone: the next merge removes it.
  CHECK(mergeWeights({ckpt, out, "--overwrite"}).exit_code == 0);
  CHECK(!fs::exists(held));
}

#ifdef FINETUNE_BIN
TEST_CASE("merge-weights of a job that loaded a model folder writes a model folder finetune reads",
          "[merge_weights]") {
  using cxxlaunch::models::LlamaConfig;
  using cxxlaunch::models::LlamaForCausalLM;
  torch::set_num_threads(1);
  TempDir dir;
  // A space in the name: the manifest records the folder whatever its bytes.
  const std::string model = dir.path() + "/tiny model", text = dir.path() + "/text.txt";
  const Finished init = cxxlaunch::testing::run(
      {LLAMA_INIT_BIN, "--output_dir", model, "--hidden_size", "32", "--intermediate_size", "64",
       "--num_hidden_layers", "2", "--num_attention_heads", "4", "--num_key_value_heads", "2",
       "--vocab_size", "300"});
  INFO(init.err);
  REQUIRE(init.exit_code == 0);
  const std::map<std::string, std::string> extra = {
      {"tokenizer_config.json", "{\"model_max_length\": 64}\n"},
      {"special_tokens_map.json", "{}\n"},
      {"generation_config.json", "{\"do_sample\": false}\n"}};
  for (const auto& [name, body] : extra) std::ofstream(model + "/" + name) << body;
  {
    std::ofstream out(text);
    for (int i = 0; i < 40; ++i) out << "The quick brown fox jumps over the lazy dog.\n";
  }
  // A job that loads the folder, takes a step and saves a checkpoint; a second job resumes from
  // it without loading the folder, and its checkpoint names the folder all the same.
  const std::string first = dir.path() + "/first/checkpoint_1";
  const std::string ckpt = dir.path() + "/ckpt/checkpoint_2";
  for (const bool resumed : {false, true}) {
    auto fake = makeFakeWorld(1);
    torch::manual_seed(3);
    LlamaForCausalLM net(LlamaConfig::fromFile(model + "/config.json"));
    torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-3));
    World world;
    world.env.rank = 0;
    world.env.world_size = 1;
    world.backend = makeFakeBackend(fake, 0);
    Accelerator acc(std::move(world), {});
    acc.prepare(net.ptr(), optimizer);
    if (resumed) {
      acc.loadState(first);
    } else {
      acc.loadModel(model + "/");
    }
    const auto x = torch::randint(0, 300, {2, 8});
    acc.backward(cxxlaunch::models::causalLmLoss(net->forward(x), x));
    REQUIRE(acc.step());
    acc.saveState(resumed ? ckpt : first);
  }
  const std::string out = dir.path() + "/merged";
  const Finished merged = mergeWeights({dir.path() + "/ckpt", out});
  INFO(merged.err);
  REQUIRE(merged.exit_code == 0);
  CHECK(merged.err.empty());
  CHECK(merged.out.find("config.json") != std::string::npos);
  CHECK(cxxlaunch::testing::readFile(out + "/config.json") ==
        cxxlaunch::testing::readFile(model + "/config.json"));
  for (const auto& [name, body] : extra)
    CHECK(cxxlaunch::testing::readFile(out + "/" + name) == body);
  CHECK(!fs::exists(out + "/tokenizer.json"));  // the folder has none
  const Finished evaluated =
      cxxlaunch::testing::run({FINETUNE_BIN, "--model_dir", out, "--data", text, "--steps", "0",
                               "--seq_len", "16", "--batch_size", "2"},
                              {}, std::chrono::seconds(120));
  INFO(evaluated.out << evaluated.err);
  CHECK(evaluated.exit_code == 0);
  CHECK(evaluated.out.find("eval loss") != std::string::npos);

  // The folder moved away since: the weights all the same, and a warning that names it.
  fs::rename(model, model + " moved");
  const Finished gone = mergeWeights({ckpt, dir.path() + "/weights-only"});
  INFO(gone.err);
  CHECK(gone.exit_code == 0);
  CHECK(gone.err.rfind("cxxlaunch merge-weights: warning: ", 0) == 0);
  CHECK(gone.err.find("'" + model + "', which is gone") != std::string::npos);
  CHECK(fs::exists(dir.path() + "/weights-only/model.safetensors"));
  CHECK(!fs::exists(dir.path() + "/weights-only/config.json"));
}
#endif
