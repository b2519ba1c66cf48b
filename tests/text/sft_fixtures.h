#pragma once
// Model folders for the training-data tests: fixtures.h's byte-level tokenizer with two chat
// tokens added, 303 "<|im_start|>" and 304 "<|im_end|>" (special; <|im_end|> is the EOS), and a
// small ChatML template, so that the expected ids are worked out by hand: a byte is its own id
// (fixtures.h lists the few merges, which the texts here avoid) and <s> (300) starts what is
// tokenized with add_special_tokens.

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "fixtures.h"

namespace cxxlaunch::text::fixtures {

inline constexpr int32_t kBos = 300, kImStart = 303, kImEnd = 304, kNewline = 10;

// The ChatML of Qwen without its default system message.
inline const char* kChatMl =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

inline nlohmann::json chatTokenizerFixture() {
  auto file = byteLevelFixture();
  for (const auto& [id, content] : {std::pair{kImStart, "<|im_start|>"}, {kImEnd, "<|im_end|>"}}) {
    file["added_tokens"].push_back({{"id", id},
                                    {"content", content},
                                    {"special", true},
                                    {"normalized", false},
                                    {"lstrip", false},
                                    {"rstrip", false},
                                    {"single_word", false}});
  }
  return file;
}

inline void writeText(const std::string& path, const std::string& content) {
  std::ofstream(path, std::ios::binary) << content;
}

inline std::string testTemplate(const std::string& name) {
  std::ifstream in(std::string(TEXT_TEST_DIR) + "/templates/" + name, std::ios::binary);
  std::ostringstream source;
  source << in.rdbuf();
  return source.str();
}

// `dir` as a model folder: chatTokenizerFixture() and a tokenizer_config.json with the EOS and,
// unless empty, `chat_template`.
inline void writeChatFolder(const std::string& dir, const std::string& chat_template = kChatMl) {
  writeText(dir + "/tokenizer.json", chatTokenizerFixture().dump());
  nlohmann::json config = {{"eos_token", "<|im_end|>"}};
  if (!chat_template.empty()) config["chat_template"] = chat_template;
  writeText(dir + "/tokenizer_config.json", config.dump());
}

// The ids of text that no merge touches: its bytes.
inline std::vector<int32_t> bytesOf(const std::string& text) {
  std::vector<int32_t> ids;
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

inline std::vector<int32_t> concat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

inline std::vector<int32_t> masked(size_t n) { return std::vector<int32_t>(n, -100); }

}  // namespace cxxlaunch::text::fixtures
