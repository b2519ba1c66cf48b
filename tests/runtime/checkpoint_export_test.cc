// saveModel / loadModel's safetensors (another reader reads them), corrupt and hostile
// safetensors files, FIFOs, CRC-32C, host staging, and acc.save's atomic rank-0 writes.

#include "checkpoint_job.h"

using namespace cxxlaunch::runtime;
namespace tensorfile = cxxlaunch::tensorfile;
using namespace cxxlaunch::runtime::checkpoint_test;

namespace {

// The model `job` ends with, exported by saveModel into `dir` (files of at most `max_bytes`).
Ended export_(Job job, const std::string& dir, uint64_t max_bytes) {
  auto fake = makeFakeWorld(job.world);
  Ended ended;
  onRanks(job.world, [&](int r) {
    torch::manual_seed(job.seed);
    Tower net(11, 3);
    torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(0.01));
    World world;
    world.env.rank = r;
    world.env.world_size = job.world;
    world.env.strategy = job.strategy;
    world.env.fsdp_transformer_layer_cls = {"Block"};
    world.backend = makeFakeBackend(fake, r);
    Accelerator acc(std::move(world), {});
    acc.prepare(net.ptr(), optimizer);
    if (!job.load.empty()) {
      acc.loadModel(job.load);
    } else {
      auto [x, y] = batchOf(0, 2 * job.world);
      acc.backward(torch::mse_loss(net->forward(x.narrow(0, 2 * r, 2)), y.narrow(0, 2 * r, 2)));
      acc.step();
      acc.saveModel(dir, max_bytes);
    }
    auto params = acc.fullParameters();
    if (r == 0) {
      for (auto& [name, tensor] : params) ended.params[name] = tensor;
    }
  });
  return ended;
}

}  // namespace

TEST_CASE("saveModel writes safetensors another reader reads, loadModel reads them back",
          "[checkpoint][safetensors]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string exported = dir.path() + "/model";
  // Files of at most 700 bytes: the model (616 bytes a block, 2.3 KB in all) spans several.
  const Ended saved = export_(Job{.strategy = "zero3", .world = 2}, exported, 700);
  REQUIRE(fs::exists(exported + "/model.safetensors.index.json"));
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(exported)) {
    files += entry.path().extension() == ".safetensors";
  }
  CHECK(files > 2);
  CHECK(fs::exists(exported + "/model-00001-of-" +
                   std::string(5 - std::to_string(files).size(), '0') + std::to_string(files) +
                   ".safetensors"));

  // Python's json and struct, not our code, read the files.
  const std::string raw = dir.path() + "/values.bin";
  const auto python =
      cxxlaunch::testing::run({"/usr/bin/python3", READ_SAFETENSORS_PY, exported, raw});
  INFO(python.out << python.err);
  REQUIRE(python.exit_code == 0);
  CHECK_THAT(python.out, Catch::Contains("block0.fc.weight F32 11x11"));
  std::string expected;
  for (const auto& [name, tensor] : saved.params) {  // std::map: name order, as the script
    expected.append(static_cast<const char*>(tensor.data_ptr()), tensor.nbytes());
  }
  CHECK(cxxlaunch::testing::readFile(raw) == expected);

  // Back into a fresh model (other weights), in another strategy and world size.
  const Ended loaded =
      export_(Job{.strategy = "ddp", .world = 1, .load = exported, .seed = 7}, "", 0);
  CHECK(maxRelativeDifference(loaded, saved) == 0);
  // One file when it fits.
  export_(Job{.strategy = "zero2", .world = 2}, dir.path() + "/one", 1u << 30);
  CHECK(fs::exists(dir.path() + "/one/model.safetensors"));
  CHECK(!fs::exists(dir.path() + "/one/model.safetensors.index.json"));
}

TEST_CASE("Corrupt and crafted safetensors files get one clear error",
          "[checkpoint][safetensors]") {
  using cxxlaunch::InvalidArgument;
  using tensorfile::parseSafetensorsHeader;
  const std::string ok = R"({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}})";
  CHECK(parseSafetensorsHeader(ok, 16).size() == 1);
  auto refused = [](const std::string& header, uint64_t data, const std::string& why) {
    INFO(header);
    CHECK_THROWS_WITH(parseSafetensorsHeader(header, data), Catch::Contains(why));
  };
  refused(ok, 15, "tensor 'w': its data ends at byte 16 but the file holds 15 bytes of data");
  refused("[1, 2]", 0, "not a JSON object");
  refused("{\"w\": ", 0, "not JSON");
  refused(R"({"w": {"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}})", 8, "unknown dtype");
  refused(R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8,
          "do not match its dtype and shape");
  refused(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 8]}})", 8,
          "other than a size");
  refused(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 4294967296],
              "data_offsets": [0, 8]}})",
          8, "overflows");
  refused(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", 8,
          "tensor 'w': data_offsets end before they begin");
  refused(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
              "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
          16, "overlap");

  // Whole files: a header length beyond the file, a truncated file.
  cxxlaunch::testing::TempDir dir;
  const std::string path = dir.path() + "/bad.safetensors";
  std::ofstream(path, std::ios::binary)
      << std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) << "{}";
  CHECK_THROWS_WITH(checkpoint::readSafetensors(path, [](auto&&...) {}),
                    Catch::Contains("beyond the file"));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "abc";
  CHECK_THROWS_WITH(checkpoint::readSafetensors(path, [](auto&&...) {}),
                    Catch::Contains("shorter than its header length"));
}

namespace {

// The peak resident memory (KiB) `work` adds, run in a child process (so that nothing this test
// allocated before counts), or -1 if it threw there.
long peakGrowthKiB(const std::function<void()>& work) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(fds[0]);
    struct rusage before {
    }, after{};
    ::getrusage(RUSAGE_SELF, &before);
    long grown = -1;
    try {
      work();
      ::getrusage(RUSAGE_SELF, &after);
      grown = after.ru_maxrss - before.ru_maxrss;
    } catch (const std::exception&) {
    }
    [[maybe_unused]] const auto written = ::write(fds[1], &grown, sizeof(grown));
    ::_exit(0);
  }
  ::close(fds[1]);
  long grown = -2;
  [[maybe_unused]] const auto got = ::read(fds[0], &grown, sizeof(grown));
  ::close(fds[0]);
  ::waitpid(child, nullptr, 0);
  return grown;
}

}  // namespace

TEST_CASE("Hostile safetensors headers cost memory for what is kept, not for their size",
          "[checkpoint][safetensors]") {
  using tensorfile::parseSafetensorsHeader;
  using tensorfile::parseSafetensorsIndex;
  const size_t big = 95u << 20;
  // 95 MB of `[{},{},...]`: a DOM took 3.3 GB for it. Refused where the array opens.
  std::string array = "[";
  array.reserve(big + 8);
  while (array.size() < big) array += "{},";
  array.back() = ']';
  CHECK_THROWS_WITH(parseSafetensorsHeader(array, 0), Catch::Contains("not a JSON object"));
  // A valid header with 95 MB of __metadata__ (a DOM took 2.5 GB): loads, keeping one entry.
  std::string metadata = R"({"__metadata__": {)";
  metadata.reserve(big + 200);
  for (int i = 0; metadata.size() < big; ++i) metadata += "\"k" + std::to_string(i) + "\": \"v\",";
  metadata.back() = '}';
  metadata += R"(, "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}})";
  const long metadata_kib = peakGrowthKiB([&] {
    if (parseSafetensorsHeader(metadata, 16).size() != 1) throw std::runtime_error("lost w");
  });
  // Bounded by the text's size (nlohmann's lexer keeps the characters of a run of brackets), not
  // a multiple of it.
  CHECK(metadata_kib >= 0);
  CHECK(metadata_kib < static_cast<long>(metadata.size() / 1024));
  // A 60 MB index (a DOM took 1.7 GB): its weight_map kept, the rest skipped.
  std::string index = R"({"metadata": {"junk": [)";
  index.reserve((60u << 20) + 200);
  while (index.size() < (60u << 20)) index += "[[[{}]]],";
  index.back() = ']';
  index += R"(}, "weight_map": {"a": "one.safetensors", "b": "two.safetensors"}})";
  const long index_kib = peakGrowthKiB([&] {
    if (parseSafetensorsIndex(index).size() != 2) throw std::runtime_error("lost a file");
  });
  CHECK(index_kib >= 0);
  CHECK(index_kib < static_cast<long>(2 * index.size() / 1024));
  // What a header cannot hold stops the parse.
  auto refused = [](const std::string& header, const std::string& why) {
    INFO(header);
    CHECK_THROWS_WITH(parseSafetensorsHeader(header, 64), Catch::Contains(why));
  };
  refused(R"({"__metadata__": )" + std::string(40, '[') + std::string(40, ']') + "}",
          "nested deeper");
  std::string dims = R"({"w": {"dtype": "F32", "shape": [1)";
  for (int i = 0; i < 70; ++i) dims += ",1";
  refused(dims + R"(], "data_offsets": [0, 4]}})", "more than 64 dimensions");
  refused(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}})",
          "data_offsets is not [begin, end]");
  refused(R"({"w": {"dtype": "F32", "shape": [[1]], "data_offsets": [0, 4]}})",
          "other than a size");
  refused(R"({"w": {"dtype": 7, "shape": [1], "data_offsets": [0, 4]}})", "no dtype");
  refused(R"({"w": [1]})", "not an object");
  refused(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
              "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
          "appears twice");
  CHECK(parseSafetensorsHeader(R"({"__metadata__": {"format": "pt"}, "w": {"dtype": "F32",
            "shape": [1], "data_offsets": [0, 4], "extra": {"x": [1, {"y": null}]}}})",
                               4)
            .size() == 1);
  // A tensor of no elements at another's offset: accepted, before it or after it.
  const std::string full = R"("m": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
  const std::string empty = R"("e": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]})";
  CHECK(parseSafetensorsHeader("{" + full + ", " + empty + "}", 8).size() == 2);
  CHECK(parseSafetensorsHeader("{" + empty + ", " + full + "}", 8).size() == 2);
  CHECK_THROWS_WITH(parseSafetensorsIndex(R"({"weight_map": {"a": 3}})"),
                    Catch::Contains("tensor 'a' maps to no file name"));
  CHECK_THROWS_WITH(parseSafetensorsIndex(R"({"weight_map": {"a": "../x"}})"),
                    Catch::Contains("maps to no file name"));
  CHECK_THROWS_WITH(parseSafetensorsIndex(R"({"metadata": {}})"), Catch::Contains("no weight_map"));
  CHECK_THROWS_WITH(parseSafetensorsIndex("[1]"), Catch::Contains("not a JSON object"));
}

TEST_CASE("A FIFO in a model file's place is refused, never waited on",
          "[checkpoint][safetensors]") {
  cxxlaunch::testing::TempDir dir;
  for (const std::string name : {"model.safetensors", "model.safetensors.index.json"}) {
    INFO(name);
    const std::string folder = dir.path() + "/" + name + ".d";
    fs::create_directories(folder);
    REQUIRE(::mkfifo((folder + "/" + name).c_str(), 0600) == 0);
    CHECK_THROWS_WITH(checkpoint::readSafetensors(folder, [](auto&&...) {}),
                      Catch::Contains("not a regular file"));
  }
}

TEST_CASE("CRC-32C gives the standard check value, in one piece or many", "[checkpoint]") {
  const std::string text = "123456789";
  CHECK(tensorfile::crc32c(0, text.data(), text.size()) == 0xE3069283u);
  uint32_t crc = 0;
  for (char c : text) crc = tensorfile::crc32c(crc, &c, 1);
  CHECK(crc == 0xE3069283u);
}

TEST_CASE("CRC-32C over long buffers (three chains joined) equals the bit-by-bit definition",
          "[checkpoint]") {
  auto bitwise = [](const unsigned char* p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; ++i) {
      c ^= p[i];
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
  };
  std::mt19937 random(7);
  std::vector<unsigned char> data(1 << 20);
  for (auto& b : data) b = static_cast<unsigned char>(random());
  // Around one block of three 16 KiB stretches, several blocks, odd tails and offsets.
  for (size_t n : {size_t{0}, size_t{49151}, size_t{49152}, size_t{49153}, size_t{3 * 49152 + 13},
                   data.size() - 5}) {
    for (size_t offset : {size_t{0}, size_t{3}}) {
      if (offset + n > data.size()) continue;
      INFO("bytes " << n << " from " << offset);
      CHECK(tensorfile::crc32c(0, data.data() + offset, n) == bitwise(data.data() + offset, n));
    }
  }
  // Continuing from a CRC across a split inside a block.
  const uint32_t first = tensorfile::crc32c(0, data.data(), 100001);
  CHECK(tensorfile::crc32c(first, data.data() + 100001, 400000) == bitwise(data.data(), 500001));
}

TEST_CASE("CRC-32Cs of two pieces combine into the CRC-32C of both, and a file checks once",
          "[checkpoint]") {
  std::mt19937 random(11);
  std::vector<unsigned char> data(3 << 20);
  for (auto& b : data) b = static_cast<unsigned char>(random());
  for (size_t split : {size_t{0}, size_t{1}, size_t{4096}, size_t{1} << 20, data.size() - 7}) {
    for (size_t tail : {size_t{0}, size_t{1}, size_t{5}, size_t{196608}, data.size() - split}) {
      if (split + tail > data.size()) continue;
      INFO("first " << split << " bytes, then " << tail);
      const uint32_t a = tensorfile::crc32c(0, data.data(), split);
      const uint32_t b = tensorfile::crc32c(0, data.data() + split, tail);
      CHECK(tensorfile::crc32cCombine(a, b, tail) ==
            tensorfile::crc32c(0, data.data(), split + tail));
    }
  }
  // appendChecked: the bytes' own CRC, and the file's size and CRC as append() gives them (its
  // pieces: around 192 KiB and several of them), past the page cache or through it.
  cxxlaunch::testing::TempDir dir;
  tensorfile::DurableFile plain(dir.path() + "/plain"), checked(dir.path() + "/checked");
  plain.append(data.data(), 13);
  checked.append(data.data(), 13);
  size_t at = 13;
  for (size_t n : {size_t{0}, size_t{1} << 20, size_t{196608}, size_t{196609}, size_t{1000003}}) {
    plain.append(data.data() + at, n);
    CHECK(checked.appendChecked(data.data() + at, n) == tensorfile::crc32c(0, data.data() + at, n));
    at += n;
  }
  CHECK(checked.size() == plain.size());
  CHECK(checked.crc() == plain.crc());
  CHECK(checked.crc() == tensorfile::crc32c(0, data.data(), at));
  plain.commit();
  checked.commit();
  CHECK(tensorfile::fileSizeAndCrc(dir.path() + "/checked") ==
        std::make_pair(static_cast<uint64_t>(at), plain.crc()));
}

TEST_CASE("HostStaging: reads land straight in float32 host tensors, through a copy elsewhere",
          "[checkpoint]") {
  // The copy path is the one a GPU worker's loads take; here it runs for a tensor that is not
  // plain float32 host memory: a transposed view and a bf16 tensor. What no read touches keeps
  // its value (a shard's padding).
  checkpoint::HostStaging staging;
  torch::Tensor plain = torch::zeros({3});
  torch::Tensor base = torch::full({2, 3}, 7.0f);
  torch::Tensor transposed = base.t();  // 3 x 2, not contiguous
  torch::Tensor half = torch::full({4}, 5.0, torch::kBFloat16);
  float* p = staging.hostOf(plain);
  CHECK(p == plain.data_ptr<float>());
  float* t = staging.hostOf(transposed);
  float* h = staging.hostOf(half);
  CHECK(t != transposed.data_ptr<float>());
  for (int i = 0; i < 3; ++i) p[i] = static_cast<float>(i);
  t[0] = 1.5f;  // element (0, 0) of the transposed view; the others stay 7
  h[3] = 2.0f;
  CHECK(transposed[0][0].item<float>() == 7.0f);  // not before copyBack
  staging.copyBack();
  CHECK(plain[2].item<float>() == 2.0f);
  CHECK(base[0][0].item<float>() == 1.5f);
  CHECK(base[1][2].item<float>() == 7.0f);
  CHECK(half[3].item<float>() == 2.0f);
  CHECK(half[0].item<float>() == 5.0f);
}

TEST_CASE("acc.save writes on the main process only, atomically", "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  auto fake = makeFakeWorld(2);
  onRanks(2, [&](int r) {
    World world;
    world.env.rank = r;
    world.env.world_size = 2;
    world.backend = makeFakeBackend(fake, r);
    Accelerator acc(std::move(world), {});
    acc.save(dir.path() + "/metrics.json", "{\"rank\": " + std::to_string(r) + "}\n");
    acc.save(dir.path() + "/sample.safetensors", {{"x", torch::arange(6).reshape({2, 3})}});
  });
  CHECK(cxxlaunch::testing::readFile(dir.path() + "/metrics.json") == "{\"rank\": 0}\n");
  std::map<std::string, torch::Tensor> read;
  checkpoint::readSafetensors(
      dir.path() + "/sample.safetensors",
      [&](const std::string& name, const torch::Tensor& t) { read[name] = t; });
  REQUIRE(read.count("x") == 1);
  CHECK(torch::equal(read["x"], torch::arange(6).reshape({2, 3})));
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) files += entry.is_regular_file();
  CHECK(files == 2);  // no temporary left behind
}
