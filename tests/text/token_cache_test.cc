// The token cache (text/token_cache.h): read on the next run with the same data, tokenizer and
// settings; rebuilt on any change; a file of another key, a damaged one or a symlink ignored;
// written whole or not at all.

#include "text/token_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "sft_fixtures.h"
#include "support/subprocess.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

using namespace cxxlaunch::text;
using namespace cxxlaunch::text::fixtures;
using cxxlaunch::testing::readFile;
using cxxlaunch::testing::TempDir;
namespace fs = std::filesystem;

namespace {

const char* kData =
    "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, "
    "{\"role\": \"assistant\", \"content\": \"y\"}]}\n"
    "{\"messages\": [{\"role\": \"user\", \"content\": \"z\"}, "
    "{\"role\": \"assistant\", \"content\": \"w\"}]}\n";

// A model folder, a data file and a cache folder, and a run over them as finetune makes it.
struct Run {
  TempDir dir;
  std::string model = dir.path() + "/model", data = dir.path() + "/train.jsonl",
              cache = dir.path() + "/cache";
  Run() {
    fs::create_directories(model);
    writeChatFolder(model);
    writeText(data, kData);
  }
  CachedExamples load(DataOptions options = {}) const {
    const auto tok = Tokenizer::fromFolder(model);
    const auto chat = ChatTemplate::fromFolderIfAny(model);
    return loadOrTokenize(data, model, tok, chat ? &*chat : nullptr, options, cache);
  }
  std::vector<TrainingExample> fresh(DataOptions options = {}) const {
    const auto tok = Tokenizer::fromFolder(model);
    const auto chat = ChatTemplate::fromFolderIfAny(model);
    return readTrainingExamples(data, tok, chat ? &*chat : nullptr, options);
  }
};

bool same(const std::vector<TrainingExample>& a, const std::vector<TrainingExample>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].input_ids != b[i].input_ids || a[i].labels != b[i].labels) return false;
  }
  return true;
}

std::vector<std::string> namesIn(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("token cache: the second run reads what the first wrote", "[text][cache]") {
  Run run;
  const auto first = run.load();
  CHECK_FALSE(first.cache_hit);
  CHECK(first.note.empty());
  CHECK(same(first.examples, run.fresh()));
  // The user's turn (9 ids) and the assistant's header (11) carry no loss.
  CHECK(first.examples[0].labels == concat({masked(9 + 11), {'y', kImEnd, kNewline}}));
  // One file, named by its key; no temporary file left.
  CHECK(namesIn(run.cache) == std::vector<std::string>{fs::path(first.cache_file).filename()});
  CHECK(fs::path(first.cache_file).filename().string().size() == 64 + 7);
  const auto second = run.load();
  CHECK(second.cache_hit);
  CHECK(second.cache_file == first.cache_file);
  CHECK(same(second.examples, first.examples));
  // The folder is made private to its user.
  struct stat st {};
  REQUIRE(::stat(run.cache.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
}

TEST_CASE("token cache: any change of data, tokenizer, template or settings rebuilds",
          "[text][cache]") {
  Run run;
  const auto base = run.load();
  auto expectRebuilt = [&](DataOptions options = {}) {
    const auto again = run.load(options);
    CHECK_FALSE(again.cache_hit);
    CHECK(again.cache_file != base.cache_file);
    CHECK(same(again.examples, run.fresh(options)));
    CHECK(run.load(options).cache_hit);  // and read back next time
  };
  SECTION("the data") {
    writeText(run.data, std::string(kData) +
                            "{\"messages\": [{\"role\": \"assistant\", "
                            "\"content\": \"v\"}]}\n");
    expectRebuilt();
  }
  SECTION("tokenizer.json: another tokenizer's cache is not used") {
    auto file = chatTokenizerFixture();
    file["added_tokens"].push_back({{"id", 305},
                                    {"content", "y"},
                                    {"special", false},
                                    {"normalized", false},
                                    {"lstrip", false},
                                    {"rstrip", false},
                                    {"single_word", false}});
    writeText(run.model + "/tokenizer.json", file.dump());
    expectRebuilt();
    CHECK(run.load().examples[0].input_ids != base.examples[0].input_ids);
  }
  SECTION("tokenizer_config.json") {
    writeText(
        run.model + "/tokenizer_config.json",
        nlohmann::json{{"eos_token", "<|im_end|>"}, {"chat_template", std::string("S") + kChatMl}}
            .dump());
    expectRebuilt();
  }
  SECTION("chat_template.jinja, which transformers prefers") {
    writeText(run.model + "/chat_template.jinja", std::string("S") + kChatMl);
    expectRebuilt();
  }
  SECTION("max_length") { expectRebuilt({.max_length = 100}); }
  SECTION("truncation") { expectRebuilt({.max_length = 100, .truncation = true}); }
}

TEST_CASE("token cache: a file of another key under this key's name is not used", "[text][cache]") {
  Run run;
  const auto truncated = run.load({.max_length = 20, .truncation = true});
  const auto whole = run.load();
  REQUIRE_FALSE(same(truncated.examples, whole.examples));
  fs::copy_file(truncated.cache_file, whole.cache_file, fs::copy_options::overwrite_existing);
  const auto again = run.load();
  CHECK_FALSE(again.cache_hit);
  CHECK_THAT(again.note, Catch::Contains("it was made from other data, tokenizer or settings"));
  CHECK(same(again.examples, whole.examples));
  CHECK(run.load().cache_hit);
}

TEST_CASE("token cache: a damaged or short file is ignored and written anew", "[text][cache]") {
  Run run;
  const auto first = run.load();
  const std::string bytes = readFile(first.cache_file);
  std::string damaged = bytes;
  std::string why;
  SECTION("cut short") {
    damaged.resize(bytes.size() - 5);
    why = "it is damaged (its size does not match its header)";
  }
  SECTION("cut inside the header") {
    damaged.resize(20);
    why = "it is damaged (too short)";
  }
  SECTION("a token changed") {
    damaged[bytes.size() - 40] ^= 1;
    why = "it is damaged (its checksum does not match)";
  }
  SECTION("empty") {
    damaged.clear();
    why = "it is damaged (too short)";
  }
  writeText(first.cache_file, damaged);
  const auto again = run.load();
  CHECK_FALSE(again.cache_hit);
  CHECK(again.note == "ignored the token cache " + first.cache_file + ": " + why);
  CHECK(same(again.examples, first.examples));
  CHECK(readFile(first.cache_file) == bytes);
  CHECK(run.load().cache_hit);
}

TEST_CASE("token cache: a symlink is never followed", "[text][cache]") {
  Run run;
  const auto first = run.load();
  // A whole, valid file of this very key elsewhere, and the cache's name a link to it.
  const std::string elsewhere = run.dir.path() + "/elsewhere";
  fs::rename(first.cache_file, elsewhere);
  fs::create_symlink(elsewhere, first.cache_file);
  const auto again = run.load();
  CHECK_FALSE(again.cache_hit);
  CHECK_THAT(again.note, Catch::Contains("it is a symlink, which the cache never follows"));
  CHECK(same(again.examples, first.examples));
  // The link was replaced by a file; what it named is untouched.
  CHECK(fs::is_regular_file(fs::symlink_status(first.cache_file)));
  CHECK(readFile(elsewhere) == readFile(first.cache_file));
  CHECK(run.load().cache_hit);
}

TEST_CASE("token cache: a file that cannot be written leaves nothing behind", "[text][cache]") {
  Run run;
  const auto first = run.load();
  fs::remove(first.cache_file);
  // A folder in the way: the rename into place fails after the bytes were written and fsynced.
  fs::create_directories(first.cache_file + "/x");
  const auto again = run.load();
  CHECK_FALSE(again.cache_hit);
  CHECK(same(again.examples, first.examples));
  CHECK_THAT(again.note, Catch::Contains("it is not a regular file") &&
                             Catch::Contains("could not write the token cache " + first.cache_file +
                                             ": renaming into"));
  CHECK(namesIn(run.cache) == std::vector<std::string>{fs::path(first.cache_file).filename()});
  // A cache folder that cannot be made: the examples all the same.
  writeText(run.dir.path() + "/file", "");
  const auto tok = Tokenizer::fromFolder(run.model);
  const auto chat = ChatTemplate::fromFolderIfAny(run.model);
  const auto no_folder =
      loadOrTokenize(run.data, run.model, tok, &*chat, {}, run.dir.path() + "/file/cache");
  CHECK(same(no_folder.examples, first.examples));
  CHECK_THAT(no_folder.note, Catch::StartsWith("could not write the token cache "));
}

TEST_CASE("token cache: the default folder follows XDG_CACHE_HOME, then HOME", "[text][cache]") {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const std::string saved_xdg = xdg ? xdg : "", saved_home = home ? home : "";
  ::setenv("XDG_CACHE_HOME", "/x/cache", 1);
  CHECK(defaultTokenCacheDir() == "/x/cache/cxxlaunch/tokens");
  ::setenv("XDG_CACHE_HOME", "relative", 1);  // the XDG spec: a relative path is ignored
  ::setenv("HOME", "/home/u", 1);
  CHECK(defaultTokenCacheDir() == "/home/u/.cache/cxxlaunch/tokens");
  ::unsetenv("XDG_CACHE_HOME");
  ::unsetenv("HOME");
  CHECK(defaultTokenCacheDir().empty());
  if (xdg) ::setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1);
  if (home) ::setenv("HOME", saved_home.c_str(), 1);
}

TEST_CASE("token cache: the key is the data's, the tokenizer files' and the settings'",
          "[text][cache]") {
  Run run;
  const std::string data = readFile(run.data);
  const auto key = tokenCacheKey(data, run.model, true, {});
  CHECK(key.size() == 64);
  CHECK(key == tokenCacheKey(data, run.model, true, {}));
  CHECK(key != tokenCacheKey(data + " ", run.model, true, {}));
  CHECK(key != tokenCacheKey(data, run.model, false, {}));
  CHECK(key != tokenCacheKey(data, run.model, true, {.max_length = 1}));
  // The path of the data and of the folder are not part of it: a moved folder still hits.
  const std::string moved = run.dir.path() + "/moved";
  fs::rename(run.model, moved);
  CHECK(key == tokenCacheKey(data, moved, true, {}));
}
