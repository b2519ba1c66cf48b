// The whole pipeline on tokenizer.json files the tests write (fixtures.h), with the ids worked
// out by hand from their merges: added tokens, the Llama 3 split, ByteLevel, BPE with
// ignore_merges, the template's BOS, NFC, the SentencePiece-style pipeline, decoding, and the
// errors for what is not supported.

#include "text/tokenizer.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/error.h"
#include "fixtures.h"
#include "support/subprocess.h"

using namespace cxxlaunch;
using namespace cxxlaunch::text;
using Ids = std::vector<int32_t>;

namespace {

Tokenizer load(const nlohmann::json& file, const nlohmann::json& config = nullptr) {
  return Tokenizer::fromJson(file.dump(), config.is_null() ? "" : config.dump(), "T");
}

std::string errorOf(const nlohmann::json& file, const nlohmann::json& config = nullptr) {
  try {
    load(file, config);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("Byte-level BPE: split, byte map, merges and ignore_merges give the hand-made ids",
          "[text]") {
  const Tokenizer tok = load(fixtures::byteLevelFixture());
  CHECK(tok.encode("hello the", false) == Ids{262, 258});
  CHECK(tok.encode("12345", false) == Ids{49, 50, 51, 52, 53});  // "123"|"45": no "34" merge
  CHECK(tok.encode("a  b", false) == Ids{97, 32, 266});          // "a", " ", " b"
  CHECK(tok.encode("a\n\nb", false) == Ids{97, 267, 98});
  CHECK(tok.encode("xyz", false) == Ids{268});  // ignore_merges: in the vocabulary as it is
  CHECK(tok.encode("", false).empty());
  CHECK(tok.vocabSize() == 303);
}

TEST_CASE("The post-processor's template adds BOS only with add_special_tokens", "[text]") {
  const Tokenizer tok = load(fixtures::byteLevelFixture());
  CHECK(tok.encode("hello", true) == Ids{300, 262});
  CHECK(tok.encode("", true) == Ids{300});
  // Special tokens written in the text are tokens either way.
  CHECK(tok.encode("<s>hello", false) == Ids{300, 262});
  CHECK(tok.encode("<s>hello", true) == Ids{300, 300, 262});
}

TEST_CASE("Added tokens honour lstrip and single_word", "[text]") {
  const Tokenizer tok = load(fixtures::byteLevelFixture());
  CHECK(tok.encode("a <mask>", false) == Ids{97, 301});  // the space goes into <mask>
  // "ab" alone is the token; inside "cab" it is not.
  CHECK(tok.encode("ab cab ab", false) == Ids{302, 32, 99, 97, 98, 32, 302});
  CHECK(tok.encode("abc", false) == Ids{97, 98, 99});
  // Word characters are those of \w in Rust's regex: '_', digits and marks too.
  CHECK(tok.encode("ab.", false) == Ids{302, 46});
  CHECK(tok.encode("ab_", false) == Ids{97, 98, 95});
  CHECK(tok.encode("2ab", false) == Ids{50, 97, 98});
  CHECK(tok.encode("ab\u0301", false) == Ids{97, 98, 204, 129});  // a combining acute
}

TEST_CASE("NFC runs before the pre-tokenizer", "[text]") {
  auto file = fixtures::byteLevelFixture();
  CHECK(load(file).encode("e\u0301", false) == Ids{101, 204, 129});
  file["normalizer"] = {{"type", "NFC"}};
  CHECK(load(file).encode("e\u0301", false) == Ids{195, 169});  // é is C3 A9
}

TEST_CASE("Decoding maps GPT-2's characters back to bytes", "[text]") {
  const Tokenizer tok = load(fixtures::byteLevelFixture());
  CHECK(tok.decode({262, 258}) == "hello the");
  CHECK(tok.decode({300, 262}) == "<s>hello");
  CHECK(tok.decode({300, 262}, /*skip_special_tokens=*/true) == "hello");
  CHECK(tok.decode({302}, true) == "ab");      // added, not special
  CHECK(tok.decode({195}) == "\xEF\xBF\xBD");  // half of é
  CHECK(tok.decode(tok.encode("a  b\n\nxyz 12345 <s>", false)) == "a  b\n\nxyz 12345 <s>");
  CHECK_THROWS_AS(tok.decode({303}), InvalidArgument);
  CHECK_THROWS_AS(tok.decode({-1}), InvalidArgument);
}

TEST_CASE("SentencePiece-style BPE: Prepend/Replace, byte fallback and its decoder", "[text]") {
  const Tokenizer tok = load(fixtures::mistralFixture());
  CHECK(tok.encode("hi hi", false) == Ids{263, 263});
  CHECK(tok.encode("hi hi", true) == Ids{1, 263, 263});
  CHECK(tok.encode("<s>hi", false) == Ids{1, 263});
  CHECK(tok.encode("hi\u20ac", false) == Ids{263, 229, 133, 175});
  CHECK(tok.decode({1, 263, 229, 133, 175}, true) == "hi\u20ac");
  CHECK(tok.decode({1, 263, 263}, false) == "<s> hi hi");
  CHECK(tok.decode({229, 133}, true) == "\xEF\xBF\xBD\xEF\xBF\xBD");  // one U+FFFD per byte
}

TEST_CASE("Metaspace puts the replacement first only where the text begins with \"first\"",
          "[text]") {
  auto file = fixtures::mistralFixture();
  file["normalizer"] = nullptr;
  file["pre_tokenizer"] = {{"type", "Metaspace"},
                           {"replacement", "\u2581"},
                           {"prepend_scheme", "first"},
                           {"split", false}};
  file["decoder"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}};
  const Tokenizer first = load(file);
  CHECK(first.encode("hi hi", false) == Ids{263, 263});
  CHECK(first.encode("<s>hi", false) == Ids{1, 260, 261});  // "hi" does not begin the text
  CHECK(first.decode({263, 263}) == "hi hi");               // the first token's "▁" is dropped
  file["pre_tokenizer"]["prepend_scheme"] = "always";
  CHECK(load(file).encode("<s>hi", false) == Ids{1, 263});
  file["pre_tokenizer"]["prepend_scheme"] = "sometimes";
  CHECK_THAT(errorOf(file), Catch::Contains("prepend_scheme type 'sometimes' is not supported"));
}

TEST_CASE("tokenizer_config.json: special ids, and add_eos_token for the Llama classes", "[text]") {
  const nlohmann::json config = {{"tokenizer_class", "LlamaTokenizerFast"},
                                 {"bos_token", "<s>"},
                                 {"eos_token", {{"content", "</s>"}}},
                                 {"add_eos_token", true}};
  const Tokenizer tok = load(fixtures::mistralFixture(), config);
  CHECK(tok.bosId() == 1);
  CHECK(tok.eosId() == 2);
  CHECK_FALSE(tok.padId().has_value());
  CHECK(tok.encode("hi", true) == Ids{1, 263, 2});
  CHECK(tok.encode("hi", false) == Ids{263});
  // Another class keeps the file's own post-processor.
  nlohmann::json other = config;
  other["tokenizer_class"] = "PreTrainedTokenizerFast";
  CHECK(load(fixtures::mistralFixture(), other).encode("hi", true) == Ids{1, 263});
}

TEST_CASE("clean_up_tokenization_spaces in the config cleans decoded text as transformers",
          "[text]") {
  const auto file = fixtures::byteLevelFixture();
  const Ids ids = load(file).encode("hello the .", false);
  CHECK(load(file).decode(ids) == "hello the .");
  CHECK(load(file, {{"clean_up_tokenization_spaces", true}}).decode(ids) == "hello the.");
}

TEST_CASE("Unsupported components and malformed files are errors that name them", "[text]") {
  auto file = fixtures::byteLevelFixture();
  file["pre_tokenizer"] = {{"type", "Whitespace"}};
  CHECK(errorOf(file) ==
        "T: pre_tokenizer type 'Whitespace' is not supported (supported: Split, ByteLevel, "
        "Metaspace, Sequence)");
  file = fixtures::byteLevelFixture();
  file["model"]["type"] = "Unigram";
  CHECK(errorOf(file) == "T: model type 'Unigram' is not supported (supported: BPE)");
  file = fixtures::byteLevelFixture();
  file["normalizer"] = {{"type", "Lowercase"}};
  CHECK_THAT(errorOf(file), Catch::StartsWith("T: normalizer type 'Lowercase' is not supported"));
  file = fixtures::byteLevelFixture();
  file["decoder"] = {{"type", "WordPiece"}};
  CHECK_THAT(errorOf(file), Catch::StartsWith("T: decoder type 'WordPiece' is not supported"));
  file = fixtures::byteLevelFixture();
  file["post_processor"] = {{"type", "BertProcessing"}};
  CHECK_THAT(errorOf(file),
             Catch::StartsWith("T: post_processor type 'BertProcessing' is not supported"));
  file = fixtures::byteLevelFixture();
  file["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
  CHECK_THAT(errorOf(file), Catch::Contains("behavior type 'Sideways' is not supported"));
  file = fixtures::byteLevelFixture();
  file["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "(["}};
  CHECK_THAT(errorOf(file), Catch::Contains("the regular expression '([' does not compile"));
  CHECK_THROWS_WITH(Tokenizer::fromJson("{not json", "", "T"), "T is not valid JSON");
  const Tokenizer tok = load(fixtures::byteLevelFixture());
  CHECK_THROWS_WITH(tok.encode("a\xFF", false), "the text to tokenize is not valid UTF-8");
}

TEST_CASE("fromFolder reads tokenizer.json and tokenizer_config.json", "[text]") {
  cxxlaunch::testing::TempDir dir;
  CHECK_THROWS_WITH(Tokenizer::fromFolder(dir.path()),
                    Catch::StartsWith("no tokenizer.json in " + dir.path()));
  std::ofstream(dir.path() + "/tokenizer.json") << fixtures::byteLevelFixture().dump();
  std::ofstream(dir.path() + "/tokenizer_config.json")
      << nlohmann::json{{"bos_token", "<s>"}, {"pad_token", "<mask>"}}.dump();
  const Tokenizer tok = Tokenizer::fromFolder(dir.path());
  CHECK(tok.encode("hello", true) == Ids{300, 262});
  CHECK(tok.bosId() == 300);
  CHECK(tok.padId() == 301);
  CHECK_FALSE(tok.eosId().has_value());
  CHECK(tok.tokenToId("hello") == 262);
  CHECK(tok.idToToken(258) == "\u0120the");
}

TEST_CASE("Encoding from several threads at once gives each the same ids", "[text]") {
  const Tokenizer tok = load(fixtures::byteLevelFixture());
  std::string text;
  for (int i = 0; i < 200; ++i) text += "hello the aaa" + std::to_string(i) + " ";
  const Ids expected = tok.encode(text, true);
  std::vector<Ids> got(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 20; ++k) got[t] = tok.encode(text, true);
    });
  }
  for (auto& thread : threads) thread.join();
  for (const auto& ids : got) CHECK(ids == expected);
}
