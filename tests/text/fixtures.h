#pragma once
// Small tokenizer.json files the tests write themselves, with ids worked out by hand.
//
// byteLevelFixture(): Llama 3's pipeline on a tiny vocabulary. Ids 0-255 are the 256 byte
// characters with id = byte value (so 'a' = 97, "Ġ" (space) = 32, "Ċ" (newline) = 10); merges
// add 256 "he", 257 "Ġt", 258 "Ġthe", 259 "ll", 260 "ell", 261 "hell", 262 "hello", 263 "aa",
// 264 "34", 265 "ĠĠ", 266 "Ġb", 267 "ĊĊ"; 268 "xyz" is in the vocabulary with no merge leading
// to it (ignore_merges emits it whole). Added tokens: 300 "<s>" (special), 301 "<mask>" (lstrip,
// special), 302 "ab" (single_word, not special). The post-processor puts <s> first.

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "text/unicode.h"

namespace cxxlaunch::text::fixtures {

inline const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

inline nlohmann::json byteLevelFixture() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byteToUnicode(static_cast<uint8_t>(b))] = b;
  const char* merged[] = {"he", "Ġt", "Ġthe", "ll", "ell", "hell", "hello",
                          "aa", "34", "ĠĠ",   "Ġb", "ĊĊ",  "xyz"};
  int id = 256;
  for (const char* token : merged) vocab[token] = id++;
  nlohmann::json merges = nlohmann::json::array({{"h", "e"},
                                                 {"Ġ", "t"},
                                                 {"Ġt", "he"},
                                                 {"l", "l"},
                                                 {"e", "ll"},
                                                 {"he", "ll"},
                                                 {"hell", "o"},
                                                 {"a", "a"},
                                                 {"3", "4"},
                                                 {"Ġ", "Ġ"},
                                                 {"Ġ", "b"},
                                                 {"Ċ", "Ċ"}});
  nlohmann::json file;
  file["version"] = "1.0";
  file["added_tokens"] = nlohmann::json::array({{{"id", 300},
                                                 {"content", "<s>"},
                                                 {"special", true},
                                                 {"normalized", false},
                                                 {"lstrip", false},
                                                 {"rstrip", false},
                                                 {"single_word", false}},
                                                {{"id", 301},
                                                 {"content", "<mask>"},
                                                 {"special", true},
                                                 {"normalized", false},
                                                 {"lstrip", true},
                                                 {"rstrip", false},
                                                 {"single_word", false}},
                                                {{"id", 302},
                                                 {"content", "ab"},
                                                 {"special", false},
                                                 {"normalized", false},
                                                 {"lstrip", false},
                                                 {"rstrip", false},
                                                 {"single_word", true}}});
  file["normalizer"] = nullptr;
  file["pre_tokenizer"] = {{"type", "Sequence"},
                           {"pretokenizers",
                            {{{"type", "Split"},
                              {"pattern", {{"Regex", kLlama3Pattern}}},
                              {"behavior", "Isolated"},
                              {"invert", false}},
                             {{"type", "ByteLevel"},
                              {"add_prefix_space", false},
                              {"trim_offsets", true},
                              {"use_regex", false}}}}};
  file["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"},
         {"add_prefix_space", true},
         {"trim_offsets", false},
         {"use_regex", true}},
        {{"type", "TemplateProcessing"},
         {"single",
          {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
         {"pair", nlohmann::json::array()},
         {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {300}}, {"tokens", {"<s>"}}}}}}}}}};
  file["decoder"] = {{"type", "ByteLevel"},
                     {"add_prefix_space", true},
                     {"trim_offsets", true},
                     {"use_regex", true}};
  file["model"] = {{"type", "BPE"},
                   {"dropout", nullptr},
                   {"unk_token", nullptr},
                   {"continuing_subword_prefix", nullptr},
                   {"end_of_word_suffix", nullptr},
                   {"fuse_unk", false},
                   {"byte_fallback", false},
                   {"ignore_merges", true},
                   {"vocab", vocab},
                   {"merges", merges}};
  return file;
}

// mistralFixture(): the SentencePiece-style BPE of Mistral/Llama 2 files. Ids: 0 "<unk>",
// 1 "<s>", 2 "</s>", 3-258 "<0x00>".."<0xFF>" (id = 3 + byte), 259 "▁", 260 "h", 261 "i",
// 262 "▁h", 263 "▁hi". Merges "▁ h", "▁h i". Normalizer Prepend("▁") + Replace(" ", "▁"), no
// pre-tokenizer, byte_fallback, unk "<unk>" fused; template "<s> $A"; decoder Replace("▁", " "),
// ByteFallback, Fuse, Strip(" ", 1, 0).
inline nlohmann::json mistralFixture() {
  nlohmann::json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = 3 + b;
  }
  vocab["▁"] = 259;
  vocab["h"] = 260;
  vocab["i"] = 261;
  vocab["▁h"] = 262;
  vocab["▁hi"] = 263;
  nlohmann::json file;
  auto special = [](int id, const char* content) {
    return nlohmann::json{
        {"id", id},        {"content", content}, {"special", true},     {"normalized", false},
        {"lstrip", false}, {"rstrip", false},    {"single_word", false}};
  };
  file["added_tokens"] = {special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")};
  file["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers",
       {{{"type", "Prepend"}, {"prepend", "▁"}},
        {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}}}};
  file["pre_tokenizer"] = nullptr;
  file["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  file["decoder"] = {{"type", "Sequence"},
                     {"decoders",
                      {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
                       {{"type", "ByteFallback"}},
                       {{"type", "Fuse"}},
                       {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  file["model"] = {{"type", "BPE"},         {"unk_token", "<unk>"}, {"fuse_unk", true},
                   {"byte_fallback", true}, {"vocab", vocab},       {"merges", {"▁ h", "▁h i"}}};
  return file;
}

}  // namespace cxxlaunch::text::fixtures
