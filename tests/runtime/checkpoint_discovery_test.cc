// Checkpoint folders and manifests: the newest complete checkpoint of a folder loads, manifests
// whose counters are not numbers or disagree with the rank files are refused, a damaged newest
// one is skipped with a note, a flipped bit sends the load to the newest intact one.

#include "checkpoint_job.h"

using namespace cxxlaunch::runtime;
namespace tensorfile = cxxlaunch::tensorfile;
using namespace cxxlaunch::runtime::checkpoint_test;

namespace {

// Writes manifest `m` for checkpoint `dir` as a save writes it (with its checksum).
void writeManifest(const std::string& dir, const tensorfile::Manifest& m) {
  std::vector<std::pair<uint64_t, uint32_t>> files;
  for (const auto& f : m.files) files.push_back(f.second);
  std::ofstream(dir + "/manifest", std::ios::trunc)
      << tensorfile::manifestText(m.world, m.counters, files);
}

// A manifest's text as format 1 has it: the first line's number 1, no checksum line.
std::string asFormat1(std::string text) {
  REQUIRE(text.rfind("cxxlaunch-checkpoint-manifest 2\n", 0) == 0);
  text[text.find('\n') - 1] = '1';
  text.resize(text.rfind('\n', text.size() - 2) + 1);
  REQUIRE(text.substr(text.size() - 4) == "end\n");
  return text;
}

// What `body` printed on std::cerr (the runtime's notes).
std::string stderrOf(const std::function<void()>& body) {
  std::ostringstream captured;
  std::streambuf* previous = std::cerr.rdbuf(captured.rdbuf());
  try {
    body();
  } catch (...) {
    std::cerr.rdbuf(previous);
    throw;
  }
  std::cerr.rdbuf(previous);
  return captured.str();
}

}  // namespace

TEST_CASE("A folder of checkpoints loads its newest complete one", "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string root = dir.path() + "/checkpoints";
  run(Job{.strategy = "zero2", .to_step = 1, .save = root + "/checkpoint_1"});
  run(Job{.strategy = "zero2",
          .from_step = 1,
          .to_step = 2,
          .load = root + "/checkpoint_1",
          .save = root + "/checkpoint_2"});
  // Re-saving the same step: neither fails nor hangs, and leaves one complete checkpoint.
  run(Job{.strategy = "zero2",
          .from_step = 1,
          .to_step = 2,
          .load = root + "/checkpoint_1",
          .save = root + "/checkpoint_2"});
  CHECK(tensorfile::find(root) == root + "/checkpoint_2");

  // A save that died before its manifest: only a staging directory is left.
  run(Job{.strategy = "zero2",
          .from_step = 2,
          .to_step = 3,
          .load = root,
          .save = root + "/checkpoint_3"});
  fs::rename(root + "/checkpoint_3", root + "/checkpoint_3.tmp");
  fs::remove(root + "/checkpoint_3.tmp/manifest");
  CHECK(tensorfile::find(root) == root + "/checkpoint_2");

  // A newer one whose file was cut short, or has a flipped bit: skipped.
  fs::copy(root + "/checkpoint_2", root + "/checkpoint_9");
  auto nine = tensorfile::readManifest(root + "/checkpoint_9");
  REQUIRE(nine);
  nine->counters["optimizer_steps"] = "9";
  writeManifest(root + "/checkpoint_9", *nine);
  // (a manifest written anew, checksum and all, for step 9 with step 2's files: find() goes by
  // the sizes, so it is the newest; a load refuses its counters)
  CHECK(tensorfile::find(root) == root + "/checkpoint_9");
  const std::string victim = root + "/checkpoint_9/rank1.bin";
  const std::string intact = cxxlaunch::testing::readFile(victim);
  fs::resize_file(victim, intact.size() - 1);
  CHECK(tensorfile::find(root) == root + "/checkpoint_2");
  std::string flipped = intact;
  flipped[flipped.size() / 2] = static_cast<char>(flipped[flipped.size() / 2] ^ 0x10);
  std::ofstream(victim, std::ios::binary | std::ios::trunc) << flipped;
  CHECK(tensorfile::find(root) == root + "/checkpoint_2");  // same size, another CRC
  std::ofstream(victim, std::ios::binary | std::ios::trunc) << intact;
  CHECK(tensorfile::find(root) == root + "/checkpoint_9");

  // Between the two renames of a save: the old directory is complete, the new one is staged.
  fs::rename(root + "/checkpoint_2", root + "/checkpoint_2.old");
  CHECK(tensorfile::find(root + "/checkpoint_2") == root + "/checkpoint_2.old");

  CHECK_THROWS_WITH(tensorfile::find(dir.path() + "/nothing"),
                    Catch::Contains("no complete checkpoint at"));
}

TEST_CASE("A manifest whose counters are not numbers is refused before anything loads",
          "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string good = dir.path() + "/good";
  run(Job{.to_step = 2, .save = good});
  const std::string manifest = cxxlaunch::testing::readFile(good + "/manifest");
  // A copy of the checkpoint whose counter `key` says `value`.
  auto crafted = [&](const std::string& key, const std::string& value) {
    const std::string copy = dir.path() + "/" + key.substr(0, key.find(':')) + "-" + value;
    fs::copy(good, copy);
    std::string text = manifest;
    const auto at = text.find("counter " + key + " ");
    REQUIRE(at != std::string::npos);
    const auto from = at + key.size() + 9;
    text.replace(from, text.find('\n', from) - from, value);
    // As earlier builds wrote it (format 1: no checksum, no counters in the rank files): its
    // numbers are all that can be checked.
    std::ofstream(copy + "/manifest", std::ios::trunc) << asFormat1(text);
    return copy;
  };
  // The step orders checkpoints: a manifest without a whole one is malformed, never loaded.
  const std::string bad_step = crafted("optimizer_steps", "2x");
  CHECK_THROWS_WITH(tensorfile::find(bad_step), Catch::Contains("no complete checkpoint"));
  for (const auto& [key, value, says] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"micro_step", "lots", "not a whole number"},
           {"lr:0", "nan", "not a number"},
           {"lr_groups", "1e3", "not a whole number"}}) {
    INFO(key << " " << value);
    Job job{.from_step = 2, .to_step = 3, .load = crafted(key, value)};
    std::string message;
    try {
      run(job);
    } catch (const cxxlaunch::InvalidArgument& e) {
      message = e.what();
    }
    CHECK_THAT(message, Catch::Contains("'" + key + "' is '" + value + "', " + says));
  }
}

TEST_CASE("A damaged or edited newest manifest is skipped with a note naming it and why",
          "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string root = dir.path() + "/checkpoints", newest = root + "/checkpoint_2";
  const Ended one = run(Job{.to_step = 1, .save = root + "/checkpoint_1"});
  run(Job{.from_step = 1, .to_step = 2, .load = root, .save = newest});
  const std::string pristine = cxxlaunch::testing::readFile(newest + "/manifest");
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string text = pristine;
    const auto at = text.find(from);
    REQUIRE(at != std::string::npos);
    return text.replace(at, from.size(), to);
  };
  const std::string micro = pristine.substr(pristine.find("counter micro_step "));
  const std::string micro_line = micro.substr(0, micro.find('\n'));
  for (const auto& [what, text, why] : std::vector<std::array<std::string, 3>>{
           {"its first word", replaced("checkpoint-manifest", "checkpoint-manifesto"),
            "does not begin with 'cxxlaunch-checkpoint-manifest'"},
           {"world 3", replaced("world 2", "world 3"), "does not match its CRC-32C"},
           {"cut short", pristine.substr(0, pristine.size() / 2), "has no checksum line"},
           {"empty", "", "is empty"},
           {"optimizer_steps 2 -> 9",
            replaced("counter optimizer_steps 2", "counter optimizer_steps 9"),
            "does not match its CRC-32C"},
           {"micro_step + 1", replaced(micro_line, micro_line + "1"), "does not match its CRC-32C"},
           {"a counter renamed", replaced("counter optimizer_steps", "counter optimizer_stepz"),
            "does not match its CRC-32C"}}) {
    INFO(what);
    std::ofstream(newest + "/manifest", std::ios::trunc) << text;
    Ended resumed;
    const std::string notes =
        stderrOf([&] { resumed = run(Job{.from_step = 1, .to_step = 1, .load = root}); });
    CHECK(resumed.loaded == root + "/checkpoint_1");
    CHECK(maxRelativeDifference(resumed, one) == 0);
    CHECK_THAT(notes, Catch::Contains("cxxlaunch: note: checkpoint '" + newest + "' skipped: '" +
                                      newest + "/manifest' " + why));
  }
  // Format 1 (earlier builds: no checksum line) still loads.
  std::ofstream(newest + "/manifest", std::ios::trunc) << asFormat1(pristine);
  CHECK(run(Job{.from_step = 2, .to_step = 2, .load = root}).loaded == newest);
}

TEST_CASE("Counters that disagree with what the rank files recorded are refused", "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string root = dir.path() + "/checkpoints", newest = root + "/checkpoint_2";
  const Ended one = run(Job{.to_step = 1, .save = root + "/checkpoint_1"});
  run(Job{.from_step = 1, .to_step = 2, .load = root, .save = newest});
  const std::string pristine = cxxlaunch::testing::readFile(newest + "/manifest");
  // A manifest written anew, checksum and all, for step 9: rank 0's file recorded step 2.
  auto m = tensorfile::readManifest(newest);
  REQUIRE(m);
  m->counters["optimizer_steps"] = "9";
  writeManifest(newest, *m);
  CHECK_THROWS_WITH(tensorfile::Reader(newest),
                    Catch::Contains("its manifest's counter 'optimizer_steps' is '9' where '" +
                                    newest + "/rank0.bin' recorded '2'"));
  Ended resumed;
  std::string notes =
      stderrOf([&] { resumed = run(Job{.from_step = 1, .to_step = 1, .load = root}); });
  CHECK(resumed.loaded == root + "/checkpoint_1");
  CHECK(maxRelativeDifference(resumed, one) == 0);
  CHECK_THAT(notes, Catch::Contains("'optimizer_steps' is '9'"));

  // Rank 1's file from the step-1 save, listed with its own size and CRC-32C: rank 1 (which
  // checks its share of the files) refuses it, and every rank goes on to the previous checkpoint.
  std::ofstream(newest + "/manifest", std::ios::trunc) << pristine;
  fs::copy_file(root + "/checkpoint_1/rank1.bin", newest + "/rank1.bin",
                fs::copy_options::overwrite_existing);
  m = tensorfile::readManifest(newest);
  REQUIRE(m);
  m->files[1].second = tensorfile::fileSizeAndCrc(newest + "/rank1.bin");
  writeManifest(newest, *m);
  const tensorfile::Reader reader(newest);
  CHECK_NOTHROW(reader.checkCounters(0, 2));
  CHECK_THROWS_WITH(
      reader.checkCounters(1, 2),
      Catch::Contains("'optimizer_steps' is '2' where '" + newest + "/rank1.bin' recorded '1'"));
  notes = stderrOf([&] { resumed = run(Job{.from_step = 1, .to_step = 1, .load = root}); });
  CHECK(resumed.loaded == root + "/checkpoint_1");
  CHECK_THAT(notes, Catch::Contains("rank1.bin' recorded '1'"));
}

TEST_CASE("A load that reads a flipped bit goes on from the newest intact checkpoint",
          "[checkpoint]") {
  torch::set_num_threads(1);
  cxxlaunch::testing::TempDir dir;
  const std::string root = dir.path() + "/checkpoints";
  // DDP's ranks share the reading (each reads its own file and broadcasts it): only rank 1 reads
  // the flipped bit, and rank 0 must go on from the older checkpoint with it.
  const std::array<std::array<std::string, 3>, 3> cases = {{{"zero3", "sharded", "rank0.bin"},
                                                            {"zero3", "full", "rank0.bin"},
                                                            {"ddp", "sharded", "rank1.bin"}}};
  for (const auto& [strategy, layout, file] : cases) {
    INFO(strategy << " " << layout << " " << file);
    fs::remove_all(root);
    const Ended one = run(
        Job{.strategy = strategy, .to_step = 1, .save = root + "/checkpoint_1", .layout = layout});
    run(Job{.strategy = strategy,
            .from_step = 1,
            .to_step = 2,
            .load = root,
            .save = root + "/checkpoint_2",
            .layout = layout});
    // The sizes still match: only the chunk checksums read during the load can tell.
    const std::string victim = root + "/checkpoint_2/" + file;
    std::string bytes = cxxlaunch::testing::readFile(victim);
    bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x01);
    std::ofstream(victim, std::ios::binary | std::ios::trunc) << bytes;
    const Ended resumed =
        run(Job{.strategy = strategy, .from_step = 1, .to_step = 1, .load = root});
    CHECK(resumed.loaded == root + "/checkpoint_1");
    CHECK(maxRelativeDifference(resumed, one) == 0);
  }
}
