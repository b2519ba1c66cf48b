// Damaged, crafted and foreign checkpoints: never loaded, never read out of bounds, one clear
// error; no loadable checkpoint where there were checkpoints is an error, never step 0; large
// arrays lie aligned and are read once; another model's checkpoint names the parameter.

#include "checkpoint_job.h"

using namespace cxxlaunch::runtime;
namespace tensorfile = cxxlaunch::tensorfile;
using namespace cxxlaunch::runtime::checkpoint_test;

namespace {

// `path`'s bytes with `change` applied, written back in place (same size unless it changes it).
void edit(const std::string& path, const std::function<void(std::string&)>& change) {
  std::string bytes = cxxlaunch::testing::readFile(path);
  change(bytes);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// The token at `index` (0: "slice") of the first slice line of a rank file's header.
size_t firstSliceToken(const std::string& bytes, int index) {
  size_t at = bytes.find("\nslice ");
  REQUIRE(at != std::string::npos);
  ++at;
  for (int i = 0; i < index; ++i) at = bytes.find(' ', at) + 1;
  return at;
}

// Damage a checkpoint's rank file in ways its sizes do not show: each must be refused as a whole
// checkpoint, not stop the load.
const std::vector<std::pair<std::string, std::function<void(const std::string&)>>> kDamages = {
    {"its format", [](const std::string& file) { edit(file, [](auto& b) { b[21] = '4'; }); }},
    {"a parameter's name",
     [](const std::string& file) { edit(file, [](auto& b) { b[firstSliceToken(b, 1)] = 'Q'; }); }},
    {"a shape digit",
     [](const std::string& file) {
       edit(file, [](auto& b) {
         char& digit = b[firstSliceToken(b, 5)];
         digit = digit == '9' ? '1' : static_cast<char>(digit + 1);
       });
     }},
    {"its checksums' footer",
     [](const std::string& file) { edit(file, [](auto& b) { b[b.size() - 3] = 'x'; }); }},
    {"a symbolic link in its place",
     [](const std::string& file) {
       const std::string moved = file + ".real";
       fs::rename(file, moved);
       fs::create_symlink(moved, file);
     }},
};

}  // namespace

TEST_CASE(
    "A checkpoint no rank can read, whatever is wrong with it, sends every rank to the "
    "previous one",
    "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string root = dir.path() + "/checkpoints", pristine = dir.path() + "/pristine";
  // DDP's ranks share the reading (rank 1 reads rank1.bin); ZeRO-2's loads all-gather each unit
  // (a rank that fails must keep its place in them); ZeRO-3 reads its shards alone.
  for (const auto& [strategy, file] : std::vector<std::pair<std::string, std::string>>{
           {"ddp", "rank1.bin"}, {"zero2", "rank0.bin"}, {"zero3", "rank0.bin"}}) {
    fs::remove_all(root);
    fs::remove_all(pristine);
    const Ended one = run(Job{.strategy = strategy, .to_step = 1, .save = root + "/checkpoint_1"});
    run(Job{.strategy = strategy,
            .from_step = 1,
            .to_step = 2,
            .load = root,
            .save = root + "/checkpoint_2"});
    fs::copy(root + "/checkpoint_2", pristine);
    for (const auto& [what, damage] : kDamages) {
      INFO(strategy << ": " << file << ", " << what);
      fs::remove_all(root + "/checkpoint_2");
      fs::copy(pristine, root + "/checkpoint_2");
      damage(root + "/checkpoint_2/" + file);
      const Ended resumed =
          run(Job{.strategy = strategy, .from_step = 1, .to_step = 1, .load = root});
      CHECK(resumed.loaded == root + "/checkpoint_1");
      CHECK(maxRelativeDifference(resumed, one) == 0);
    }
  }
}

TEST_CASE("No loadable checkpoint where there were checkpoints is an error, never step 0",
          "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string root = dir.path() + "/checkpoints";
  CHECK_FALSE(tensorfile::holdsCheckpoints(root));  // no folder: a fresh start
  fs::create_directories(root + "/checkpoint_5.tmp");
  CHECK_FALSE(tensorfile::holdsCheckpoints(root));  // the first save died: a fresh start
  run(Job{.to_step = 1, .save = root + "/checkpoint_1"});
  run(Job{.from_step = 1, .to_step = 2, .load = root, .save = root + "/checkpoint_2"});
  CHECK(tensorfile::holdsCheckpoints(root));
  kDamages[0].second(root + "/checkpoint_1/rank0.bin");
  kDamages[1].second(root + "/checkpoint_2/rank1.bin");
  CHECK(tensorfile::holdsCheckpoints(root));
  CHECK_THROWS_WITH(run(Job{.from_step = 2, .to_step = 2, .load = root}),
                    Catch::Contains("no checkpoint at '" + root + "' can be loaded") &&
                        Catch::Contains("checkpoint_2: ") && Catch::Contains("checkpoint_1: ") &&
                        Catch::Contains("to start from step 0"));
  // Even without a manifest, a directory named as saveCheckpoint names them was a checkpoint.
  fs::remove(root + "/checkpoint_1/manifest");
  fs::remove_all(root + "/checkpoint_2");
  CHECK(tensorfile::holdsCheckpoints(root));
}

TEST_CASE("A checkpoint reached through a symbolic link is never loaded", "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string root = dir.path() + "/checkpoints", outside = dir.path() + "/outside";
  run(Job{.to_step = 1, .save = root + "/checkpoint_1"});
  run(Job{.from_step = 1, .to_step = 2, .load = root, .save = outside + "/checkpoint_2"});
  fs::create_directory_symlink(outside + "/checkpoint_2", root + "/checkpoint_99");
  CHECK(tensorfile::complete(root) == std::vector<std::string>{root + "/checkpoint_1"});
  CHECK(run(Job{.from_step = 1, .to_step = 1, .load = root}).loaded == root + "/checkpoint_1");
  tensorfile::removeOldest(root, 1);  // nor counted, nor removed
  CHECK(fs::is_symlink(root + "/checkpoint_99"));
  CHECK(fs::exists(outside + "/checkpoint_2/manifest"));
}

TEST_CASE("Rank files whose slices overlap are refused as corrupt", "[checkpoint]") {
  cxxlaunch::testing::TempDir dir;
  const std::string ckpt = dir.path() + "/checkpoint_1";
  fs::create_directories(ckpt);
  // Two files whose checksums are right, each claiming half of `w` (8 elements) twice over, so
  // that together they "cover" 8 elements while elements 4 to 7 are never read.
  auto writeRank = [&](int rank, int64_t begin) {
    const torch::Tensor values = torch::full({4}, static_cast<float>(rank + 1));
    const std::string path = ckpt + "/rank" + std::to_string(rank) + ".bin";
    checkpoint::writeShardFile(path, {{"w", {8}, begin, begin + 4, {{"param", values}}}}, {});
    return tensorfile::fileSizeAndCrc(path);
  };
  auto manifest = [&](int64_t second_begin) {
    const auto a = writeRank(0, 0), b = writeRank(1, second_begin);
    std::ofstream(ckpt + "/manifest", std::ios::trunc)
        << "cxxlaunch-checkpoint-manifest 1\nworld 2\ncounter optimizer_steps 1\n"
        << "file rank0.bin " << a.first << ' ' << a.second << "\nfile rank1.bin " << b.first << ' '
        << b.second << "\nend\n";
  };
  manifest(4);
  CHECK_NOTHROW(tensorfile::Reader(ckpt));
  manifest(0);
  CHECK_THROWS_WITH(tensorfile::Reader(ckpt),
                    Catch::Contains("is corrupt: its slices of 'w' (param) overlap"));
  manifest(2);
  CHECK_THROWS_WITH(tensorfile::Reader(ckpt), Catch::Contains("elements 0-4 and 2-6"));
}

TEST_CASE("Crafted rank files are refused, never read out of bounds", "[checkpoint]") {
  cxxlaunch::testing::TempDir dir;
  auto write = [&](const std::string& header, const std::string& data) {
    char first[64];
    std::snprintf(first, sizeof(first), "cxxlaunch-checkpoint 1 %020zu\n", header.size());
    const std::string path = dir.path() + "/rank0.bin";
    std::ofstream(path, std::ios::binary | std::ios::trunc) << first << header << data;
    return path;
  };
  using cxxlaunch::InvalidArgument;
  using tensorfile::ShardFileReader;
  CHECK_NOTHROW(ShardFileReader(write("slice w 0 2 1 2 1 param 0\n", std::string(8, '\0'))));
  CHECK_THROWS_AS(ShardFileReader(write("slice w 0 2 1 2 1 param 4\n", std::string(8, '\0'))),
                  InvalidArgument);  // array past the end
  CHECK_THROWS_AS(ShardFileReader(write("slice w 0 3 1 2 1 param 0\n", std::string(12, '\0'))),
                  InvalidArgument);  // range past the parameter
  CHECK_THROWS_AS(ShardFileReader(write("slice w 0 1 1 -2 1 param 0\n", std::string(4, '\0'))),
                  InvalidArgument);  // negative size
  CHECK_THROWS_AS(ShardFileReader(write("blob b 0 99\n", "x")), InvalidArgument);
  CHECK_THROWS_AS(ShardFileReader(write("slice w 0 2 1 2 1 param 18446744073709551612\n",
                                        std::string(8, '\0'))),
                  InvalidArgument);  // an offset that wraps around
  CHECK_THROWS_AS(ShardFileReader(write("delete everything\n", "")), InvalidArgument);
  { std::ofstream(dir.path() + "/rank0.bin", std::ios::trunc) << "cxxlaunch-checkpoint 1 99999"; }
  CHECK_THROWS_AS(ShardFileReader(dir.path() + "/rank0.bin"), InvalidArgument);
}

TEST_CASE(
    "Checksum chunks are the file's own: format 2's of 2^20 elements still read, bad ones refused",
    "[checkpoint]") {
  cxxlaunch::testing::TempDir dir;
  const std::string path = dir.path() + "/rank0.bin";
  // One slice "w" of `n` elements 0.5 * i, by hand as a writer of `format` would write it, with
  // `checksums` as its checksums' first line and the CRC-32C of each `chunk` elements.
  auto write = [&](int format, const std::string& checksums, int64_t chunk, int64_t n) {
    std::vector<float> values(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = 0.5f * static_cast<float>(i);
    const std::string header =
        "slice w 0 " + std::to_string(n) + " 1 " + std::to_string(n) + " 1 param 0\n";
    std::string sums = checksums + "\narray " + std::to_string((n + chunk - 1) / chunk);
    for (int64_t c = 0; c * chunk < n; ++c) {
      char crc[16];
      std::snprintf(crc, sizeof(crc), " %08x",
                    tensorfile::crc32c(0, values.data() + c * chunk,
                                       static_cast<size_t>(std::min(chunk, n - c * chunk)) * 4));
      sums += crc;
    }
    sums += "\n";
    char first[64], footer[64];
    std::snprintf(first, sizeof(first), "cxxlaunch-checkpoint %d %020zu\n", format, header.size());
    std::snprintf(footer, sizeof(footer), "cxxlaunch-checksums %020zu\n", values.size() * 4);
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        << first << header
        << std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4) << sums
        << footer;
    return values;
  };
  auto flip = [&](int64_t element) {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    const tensorfile::ShardFileReader reader(path);
    file.seekp(
        static_cast<std::streamoff>(reader.slices().at(0).arrays.at(0).second + element * 4));
    file.put('\x7f');
  };
  struct Case {
    int format;
    std::string checksums;
    int64_t chunk, n, flipped, chunk_begin, chunk_end;  // the chunk the flipped element is in
  };
  const int64_t M = int64_t{1} << 20;
  for (const Case& c : {Case{2, "checksums", M, M + 100, M + 5, M, M + 100},
                        Case{3, "checksums 1024", 1024, 3000, 2100, 2048, 3000},
                        Case{3, "checksums 262144", 262144, M + 7, 300000, 262144, 524288}}) {
    INFO(c.format << " " << c.checksums);
    const std::vector<float> values = write(c.format, c.checksums, c.chunk, c.n);
    std::vector<float> out(static_cast<size_t>(c.n));
    {
      const tensorfile::ShardFileReader reader(path);
      REQUIRE(reader.checksReads());
      reader.read(reader.slices().at(0).arrays.at(0).second, 0, 0, c.n, out.data());
      CHECK_FALSE(reader.corruption());
      CHECK(out == values);
    }
    flip(c.flipped);
    const tensorfile::ShardFileReader damaged(path);
    damaged.read(damaged.slices().at(0).arrays.at(0).second, 0, 0, c.n, out.data());
    CHECK(damaged.corruption().value_or("") ==
          "checkpoint file '" + path + "': 'w' param, elements " + std::to_string(c.chunk_begin) +
              " to " + std::to_string(c.chunk_end) + ", does not match its checksum");
  }
  using cxxlaunch::InvalidArgument;
  for (const auto& [format, line] :
       std::vector<std::pair<int, std::string>>{{3, "checksums"},
                                                {3, "checksums 0"},
                                                {3, "checksums 512"},
                                                {3, "checksums 33554432"},
                                                {3, "checksums x"},
                                                {3, "checksums 1024 7"},
                                                {2, "checksums 1024"},
                                                {4, "checksums 1024"}}) {
    INFO(format << " " << line);
    write(format, line, 1024, 3000);
    CHECK_THROWS_AS(tensorfile::ShardFileReader(path), InvalidArgument);
  }
}

TEST_CASE("Large arrays lie aligned in their file and read past the page cache into any memory",
          "[checkpoint]") {
  // More whole checksum chunks than one read takes and a tail that is no whole 4 KiB block,
  // after a small array (which leaves the big one's offset unaligned unless the writer pads).
  const int64_t n =
      (tensorfile::chunksPerRead(tensorfile::kChunkElements) + 1) * tensorfile::kChunkElements +
      1234;
  const torch::Tensor values = torch::arange(n, torch::kFloat) * 0.5;
  const std::vector<StateView> slices = {
      {"small", {3}, 0, 3, {{"param", torch::arange(3, torch::kFloat)}}},
      {"big", {n + 10}, 10, n + 10, {{"param", values}, {"exp_avg", -values}}}};
  float* memory = nullptr;
  REQUIRE(::posix_memalign(reinterpret_cast<void**>(&memory), 4096, (n + 4096) * 4) == 0);
  std::unique_ptr<float, decltype(&std::free)> owner(memory, &std::free);
  cxxlaunch::testing::TempDir disk;
  std::vector<std::string> folders = {disk.path()};  // O_DIRECT; tmpfs may refuse it
  if (fs::is_directory("/dev/shm")) folders.push_back("/dev/shm");
  for (const std::string& folder : folders) {
    INFO(folder);
    const std::string path = folder + "/cxxlaunch-rank0-" + std::to_string(::getpid()) + ".bin";
    checkpoint::writeShardFile(path, slices, {{"rng", "abc"}});
    const tensorfile::ShardFileReader reader(path);
    const auto& big = reader.slices().at(1);
    for (const auto& [array, offset] : big.arrays) CHECK(offset % 4096 == 0);
    // Element ranges and where they land: memory aligned as the file is, misaligned, and a range
    // from inside a chunk into memory aligned as that element is in the file.
    struct Case {
      int64_t from, to, at;  // elements of the parameter; the float in `memory` it starts at
    };
    const int64_t inside = 10 + 5000;
    for (const Case c :
         {Case{10, n + 10, 0}, Case{10, n + 10, 1}, Case{inside, n + 3, 5000 % 1024}}) {
      INFO("elements " << c.from << " to " << c.to << " at float " << c.at);
      std::fill(memory, memory + n + 4096, std::nanf(""));
      reader.read(big.arrays[0].second, 10, c.from, c.to, memory + c.at);
      const float* expected = values.data_ptr<float>() + (c.from - 10);
      CHECK(std::memcmp(memory + c.at, expected, static_cast<size_t>(c.to - c.from) * 4) == 0);
      CHECK(std::isnan(memory[c.at + (c.to - c.from)]));  // nothing written past the range
      if (c.at > 0) CHECK(std::isnan(memory[c.at - 1]));
    }
    CHECK_FALSE(reader.corruption());
    CHECK(reader.blob("rng") == "abc");
    if (cxxlaunch::testing::takesDirectIo(folder)) {
      // Written and read past the page cache: only the header, the checksums and the ends of
      // reads (less than a block each) went through it, of about 18000 pages.
      CHECK(cxxlaunch::testing::residentPages(path) < 16);
    }
    // A flipped bit in a chunk inside one read is found, and named by that chunk's elements.
    const int64_t chunk = 5, K = tensorfile::kChunkElements;
    {
      std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
      file.seekp(static_cast<std::streamoff>(big.arrays[0].second + (chunk * K + 7) * 4));
      file.put('\x7f');
    }
    const tensorfile::ShardFileReader damaged(path);
    damaged.read(big.arrays[0].second, 10, 10, n + 10, memory);
    CHECK(damaged.corruption().value_or("") ==
          "checkpoint file '" + path + "': 'big' param, elements " +
              std::to_string(10 + chunk * K) + " to " + std::to_string(10 + (chunk + 1) * K) +
              ", does not match its checksum");
    fs::remove(path);
  }
}

TEST_CASE("Loading a checkpoint of another model names the parameter", "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  run(Job{.strategy = "zero2", .to_step = 1, .save = dir.path() + "/c"});
  auto fake = makeFakeWorld(1);
  CHECK_THROWS_WITH(onRanks(1,
                            [&](int r) {
                              Tower other(12, 3);  // d 12 instead of 11
                              torch::optim::AdamW optimizer(other->parameters(),
                                                            torch::optim::AdamWOptions(0.01));
                              World world;
                              world.env.strategy = "zero2";
                              world.backend = makeFakeBackend(fake, r);
                              Accelerator acc(std::move(world), {});
                              acc.prepare(other.ptr(), optimizer);
                              acc.loadState(dir.path() + "/c");
                            }),
                    Catch::Contains("has another shape there than in this model"));
}

// The bytes this process has read so far through read(2) and its kin (/proc/self/io's rchar).
uint64_t bytesReadByThisProcess() {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (io >> key >> value) {
    if (key == "rchar:") return value;
  }
  return 0;
}

TEST_CASE("A fresh DDP job's load reads each byte once, into the state that prepare made",
          "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  for (const std::string strategy : {"ddp", "fsdp_no_shard"}) {
    INFO(strategy);
    const std::string saved = dir.path() + "/" + strategy;
    const Ended uninterrupted = run(Job{.strategy = strategy, .d = 256});
    run(Job{.strategy = strategy, .to_step = 2, .save = saved, .d = 256});
    uint64_t bytes = 0;
    for (const auto& f : fs::recursive_directory_iterator(saved)) {
      if (f.is_regular_file()) bytes += f.file_size();
    }
    // Both ranks are threads of this process: reading everything each, they would read 2x.
    const uint64_t before = bytesReadByThisProcess();
    const Ended resumed = run(Job{
        .strategy = strategy, .from_step = 2, .to_step = 4, .load = saved, .seed = 7, .d = 256});
    const uint64_t read = bytesReadByThisProcess() - before;
    INFO(read << " bytes read from a checkpoint of " << bytes);
    CHECK(read > bytes / 2);  // the counter counts
    CHECK(read < bytes + bytes / 4);
    // AdamW's moments, made in prepare (zeros), filled in place: no new memory for the load.
    CHECK(resumed.state_moved == 0);
    CHECK(resumed.state_kept > 0);
    // And every rank got all of it: the run ends where the uninterrupted one ends.
    CHECK(maxRelativeDifference(resumed, uninterrupted) == 0);
  }
}

TEST_CASE("Loading another model's checkpoint fails on every rank of a DDP job", "[checkpoint]") {
  // Every rank of a DDP job reads the whole checkpoint, so each finds the differing parameter and
  // says so; none waits for the others.
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  run(Job{.strategy = "ddp", .world = 2, .to_step = 1, .save = dir.path() + "/c"});
  auto fake = makeFakeWorld(2);
  std::array<std::string, 2> errors;
  onRanks(2, [&](int r) {
    Tower other(12, 3);  // d 12 instead of 11: every parameter differs
    torch::optim::AdamW optimizer(other->parameters(), torch::optim::AdamWOptions(0.01));
    World world;
    world.env.rank = r;
    world.env.world_size = 2;
    world.env.strategy = "ddp";
    world.backend = makeFakeBackend(fake, r);
    Accelerator acc(std::move(world), {});
    acc.prepare(other.ptr(), optimizer);
    try {
      acc.loadState(dir.path() + "/c");
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(r)] = e.what();
    }
  });
  for (const std::string& error : errors) {
    CHECK_THAT(error, Catch::Contains("has another shape there than in this model"));
  }
}
