#pragma once
// A model folder's chat template rendered as transformers' apply_chat_template renders it: the
// `chat_template` of tokenizer_config.json (or of chat_template.jinja beside it, which transformers
// prefers), run by our own Jinja interpreter (text/jinja_*.h) with trim_blocks and lstrip_blocks,
// over `messages`, `add_generation_prompt`, `tools` and `documents` (none unless given), the
// special tokens of tokenizer_config.json (`bos_token`, `eos_token`, ... as strings) and any extra
// variables.
//
//   auto chat = cxxlaunch::text::ChatTemplate::fromFolder("/models/Qwen2.5-0.5B-Instruct");
//   std::string text = chat.render(nlohmann::json::parse(R"([{"role": "user", "content": "Hi"}])"),
//                                  /*add_generation_prompt=*/true);
//
// The text is then tokenized with add_special_tokens=false: the template writes BOS itself.
//
// Supported Jinja: docs/text.md lists it. A construct outside it is an InvalidArgument naming the
// construct and the template's line ("chat_template line 3: filter 'wordcount' is not supported"),
// thrown when the template is loaded for statements, filters and tests, and when rendering for
// methods and functions. raise_exception(msg) in the template is an InvalidArgument with msg.
//
// No LibTorch. Thread-safety: immutable after construction; render may run from many threads.

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace cxxlaunch::text {

namespace jinja {
class Template;
}

class ChatTemplate {
 public:
  // DIR/chat_template.jinja if present, else DIR/tokenizer_config.json's chat_template; the
  // special tokens from tokenizer_config.json. InvalidArgument when there is no template.
  static ChatTemplate fromFolder(const std::string& dir);

  // fromFolder(dir) when the folder ships a template (chat_template.jinja, or a chat_template in
  // tokenizer_config.json); nullopt when it ships none. A template that is there but broken
  // throws as fromFolder does.
  static std::optional<ChatTemplate> fromFolderIfAny(const std::string& dir);

  // From tokenizer_config.json's text: `chat_template` a string, or a list of {name, template}
  // of which "default" is used. `source` names the file in messages.
  static ChatTemplate fromConfigJson(std::string_view tokenizer_config_json,
                                     const std::string& source = "tokenizer_config.json");

  // A template's text with the special-token variables given as a JSON object of strings
  // (e.g. {"bos_token": "<s>", "eos_token": "</s>"}).
  static ChatTemplate fromString(const std::string& source,
                                 const nlohmann::json& special_tokens = nlohmann::json::object());

  // `messages`: a JSON array of {role, content, ...}. `extra`: a JSON object of further variables
  // (e.g. {"enable_thinking": false}, "tools", "date_string"); they override the defaults.
  // Objects keep their key order (tojson shows it), as Python's json.loads keeps it: parse with
  // nlohmann::ordered_json. The nlohmann::json overload renders its (sorted) order.
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  std::string render(const nlohmann::json& messages, bool add_generation_prompt,
                     const nlohmann::json& extra = nlohmann::json::object()) const;

  const std::string& source() const;

 private:
  struct Impl;
  explicit ChatTemplate(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace cxxlaunch::text
