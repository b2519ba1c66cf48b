// The pieces of the pipeline one at a time: GPT-2's byte table, lossy UTF-8, NFC, the regex
// engine on the Llama 3 pattern, Split's behaviors, and BPE merging by rank.

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "fixtures.h"
#include "text/bpe.h"
#include "text/pre_tokenizer.h"
#include "text/regex.h"
#include "text/unicode.h"

using namespace cxxlaunch;
using namespace cxxlaunch::text;
using Strings = std::vector<std::string>;

namespace {

Strings pieces(const Regex& regex, const std::string& text) {
  std::vector<std::pair<size_t, size_t>> matches;
  regex.findAll(text, matches);
  return splitByMatches(text, matches, SplitBehavior::kIsolated, false);
}

}  // namespace

TEST_CASE("GPT-2's byte table maps printable bytes to themselves and the rest above U+00FF",
          "[text]") {
  CHECK(byteToUnicode('A') == "A");
  CHECK(byteToUnicode(' ') == "\u0120");   // Ġ
  CHECK(byteToUnicode('\n') == "\u010A");  // Ċ
  CHECK(byteToUnicode(0) == "\u0100");
  CHECK(byteToUnicode(0xAD) == "\u0143");  // the 68th, after 0-32 (33), 127-160 (34)
  CHECK(byteToUnicode(0xA1) == "\u00A1");
  for (int b = 0; b < 256; ++b) {
    size_t i = 0;
    CHECK(unicodeToByte(nextCodePoint(byteToUnicode(static_cast<uint8_t>(b)), i)) == b);
  }
  CHECK(unicodeToByte(U'\u0144') == -1);
}

TEST_CASE("Lossy UTF-8 replaces each maximal ill-formed subsequence with one U+FFFD", "[text]") {
  CHECK(utf8Lossy("ok \xC3\xA9") == "ok \xC3\xA9");
  CHECK(utf8Lossy("\xC3") == "\xEF\xBF\xBD");
  CHECK(utf8Lossy("\xE2\x82x") == "\xEF\xBF\xBDx");            // a truncated 3-byte sequence
  CHECK(utf8Lossy("\xFF\xFE") == "\xEF\xBF\xBD\xEF\xBF\xBD");  // two stray bytes
  CHECK(utf8Lossy("\xED\xA0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
}

TEST_CASE("NFC composes through ICU and leaves normalized text alone", "[text]") {
  std::string text = "cafe\u0301 \u1100\u1161";
  normalizeInPlace(text, NormalForm::kNfc);
  CHECK(text == "caf\u00e9 \uac00");
  std::string ligature = "\ufb01";
  normalizeInPlace(ligature, NormalForm::kNfc);
  CHECK(ligature == "\ufb01");
  normalizeInPlace(ligature, NormalForm::kNfkc);
  CHECK(ligature == "fi");
}

TEST_CASE("The Llama 3 pattern splits as the tokenizers library does", "[text]") {
  const Regex regex(fixtures::kLlama3Pattern);
  CHECK(pieces(regex, "Hello world") == Strings{"Hello", " world"});
  // Case-insensitive contractions; letters after them start a new piece.
  CHECK(pieces(regex, "it'S DON'T we'll") == Strings{"it", "'S", " DON", "'T", " we", "'ll"});
  // Numbers in runs of at most three digits.
  CHECK(pieces(regex, "12345") == Strings{"123", "45"});
  // \s+(?!\S): a run of spaces leaves its last one to the word after it.
  CHECK(pieces(regex, "a   b") == Strings{"a", "  ", " b"});
  CHECK(pieces(regex, "a \n\n b") == Strings{"a", " \n\n", " b"});
  CHECK(pieces(regex, "x  ") == Strings{"x", "  "});
  // Punctuation takes the newlines after it; a letter after a non-letter joins it.
  CHECK(pieces(regex, "end.\n\nNext") == Strings{"end", ".\n\n", "Next"});
  CHECK(pieces(regex, "\xE4\xBD\xA0\xE5\xA5\xBD!") == Strings{"\xE4\xBD\xA0\xE5\xA5\xBD", "!"});
}

TEST_CASE("Oniguruma's whitespace class is the White_Space property spelled out for PCRE2",
          "[text]") {
  const std::string translated = translateOnigurumaPattern(R"(\s+(?!\S)|[^\s\p{L}])");
  CHECK(translated.find("\\s") == std::string::npos);
  CHECK(translated.find("\\S") == std::string::npos);
  const Regex regex(R"(\s+)");
  std::vector<std::pair<size_t, size_t>> matches;
  regex.findAll(
      "a\xC2\x85"
      "b",
      matches);  // U+0085 is White_Space
  CHECK(matches.size() == 1);
  matches.clear();
  regex.findAll(
      "a\xE1\xA0\x8E"
      "b",
      matches);  // U+180E is not (PCRE2's \h has it)
  CHECK(matches.empty());
  CHECK_THROWS_AS(Regex("(unclosed"), InvalidArgument);
}

TEST_CASE("Split behaviors fold matches as the tokenizers library does", "[text]") {
  const std::string text = "a--b-c";
  const std::vector<std::pair<size_t, size_t>> dashes{{1, 2}, {2, 3}, {4, 5}};
  CHECK(splitByMatches(text, dashes, SplitBehavior::kIsolated, false) ==
        Strings{"a", "-", "-", "b", "-", "c"});
  CHECK(splitByMatches(text, dashes, SplitBehavior::kRemoved, false) == Strings{"a", "b", "c"});
  CHECK(splitByMatches(text, dashes, SplitBehavior::kMergedWithPrevious, false) ==
        Strings{"a-", "-", "b-", "c"});
  CHECK(splitByMatches(text, dashes, SplitBehavior::kMergedWithNext, false) ==
        Strings{"a", "-", "-b", "-c"});
  CHECK(splitByMatches(text, dashes, SplitBehavior::kContiguous, false) ==
        Strings{"a", "--", "b", "-", "c"});
  CHECK(splitByMatches(text, dashes, SplitBehavior::kRemoved, true) == Strings{"-", "-", "-"});
}

TEST_CASE("ByteLevel adds a prefix space, applies GPT-2's regex and maps bytes", "[text]") {
  const auto byte_level = makePreTokenizer(
      {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}}, "test");
  Strings pieces{"Hello world's 42"};
  bool at_start = true;
  byte_level->preTokenize(pieces, at_start);
  CHECK(pieces == Strings{"\u0120Hello", "\u0120world", "'s", "\u012042"});
  const auto no_regex = makePreTokenizer(
      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}, "test");
  Strings one{"a b\n\xC3\xA9"};
  no_regex->preTokenize(one, at_start);
  CHECK(one == Strings{"a\u0120b\u010A\u00C3\u00A9"});
}

TEST_CASE("BPE merges the lowest rank first, leftmost among equals", "[text]") {
  auto spec = fixtures::byteLevelFixture()["model"];
  spec["ignore_merges"] = false;
  const auto bpe = Bpe::fromJson(spec, "test");
  auto ids = [&](const std::string& word) {
    std::vector<int32_t> out;
    bpe->tokenize(word, out);
    return out;
  };
  // h e l l o: "h e" (0), then "l l" (3), then "he ll" (5), then "hell o" (6). "e ll" (4) never
  // applies because "h e" took the e first.
  CHECK(ids("hello") == std::vector<int32_t>{262});
  CHECK(ids("hello") == std::vector<int32_t>{262});  // from the cache
  CHECK(ids("\u0120the") == std::vector<int32_t>{258});
  CHECK(ids("aaa") == std::vector<int32_t>{263, 97});
  CHECK(ids("aaaa") == std::vector<int32_t>{263, 263});
  CHECK(ids("xyz") == std::vector<int32_t>{120, 121, 122});  // no merge leads to "xyz"
  spec["ignore_merges"] = true;
  CHECK(([&] {
          std::vector<int32_t> out;
          Bpe::fromJson(spec, "test")->tokenize("xyz", out);
          return out;
        }()) == std::vector<int32_t>{268});
}

TEST_CASE("BPE reads merges as \"a b\" strings and as pairs alike", "[text]") {
  auto spec = fixtures::byteLevelFixture()["model"];
  nlohmann::json strings = nlohmann::json::array();
  for (const auto& pair : spec["merges"]) {
    strings.push_back(pair[0].get<std::string>() + " " + pair[1].get<std::string>());
  }
  spec["merges"] = strings;
  std::vector<int32_t> out;
  Bpe::fromJson(spec, "test")->tokenize("hello", out);
  CHECK(out == std::vector<int32_t>{262});
}

TEST_CASE("BPE falls back to <0xNN> byte tokens, else to a fused unk", "[text]") {
  auto spec = fixtures::mistralFixture()["model"];
  auto ids = [&](const nlohmann::json& model, const std::string& word) {
    std::vector<int32_t> out;
    Bpe::fromJson(model, "test")->tokenize(word, out);
    return out;
  };
  // "€" is E2 82 AC: <0xE2> = 3 + 226, <0x82> = 3 + 130, <0xAC> = 3 + 172.
  CHECK(ids(spec, "\u2581hi\u20ac") == std::vector<int32_t>{263, 229, 133, 175});
  spec["byte_fallback"] = false;
  CHECK(ids(spec, "\u2581hi\u20ac\u20ac") == std::vector<int32_t>{263, 0});
  spec["fuse_unk"] = false;
  CHECK(ids(spec, "\u2581hi\u20ac\u20ac") == std::vector<int32_t>{263, 0, 0});
}

TEST_CASE("A merge that names a token outside the vocabulary is an error naming it", "[text]") {
  auto spec = fixtures::byteLevelFixture()["model"];
  spec["merges"].push_back({"he", "llo"});
  try {
    Bpe::fromJson(spec, "F: model");
    FAIL("no error");
  } catch (const InvalidArgument& e) {
    CHECK_THAT(e.what(), Catch::Contains("F: model: merge 12 ('he', 'llo') names 'llo'"));
  }
}
