#include "text/sft_data.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "common/error.h"
#include "common/file.h"
#include "common/utf8.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace cxxlaunch::text {
namespace {

using Json = nlohmann::ordered_json;
using Ids = std::vector<int32_t>;

enum class Format { kText, kPromptCompletion, kConversationalPromptCompletion, kMessages };

const char* describe(Format f) {
  switch (f) {
    case Format::kText:
      return "{\"text\": ...}";
    case Format::kPromptCompletion:
      return "{\"prompt\": \"...\", \"completion\": \"...\"}";
    case Format::kConversationalPromptCompletion:
      return "{\"prompt\": [messages], \"completion\": [messages]}";
    case Format::kMessages:
      return "{\"messages\": [...]}";
  }
  return "";
}

// "FILE:LINE: why" as an InvalidArgument.
[[noreturn]] void fail(const std::string& where, const std::string& why) {
  throw InvalidArgument(where + ": " + why);
}

bool isBlank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

bool startsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

bool endsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

size_t commonPrefix(const Ids& a, const Ids& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t k = 0;
  while (k < n && a[k] == b[k]) ++k;
  return k;
}

// The format of one line, from its fields; other fields ("id", "tools", ...) are ignored.
Format formatOf(const Json& line, const std::string& where) {
  const bool text = line.contains("text"), messages = line.contains("messages");
  const bool prompt = line.contains("prompt"), completion = line.contains("completion");
  if (int(text) + int(messages) + int(prompt || completion) > 1) {
    fail(where,
         "the line has more than one of \"text\", \"messages\" and \"prompt\"/\"completion\"; "
         "each line is one example of one format");
  }
  if (text) {
    if (!line["text"].is_string()) fail(where, "\"text\" must be a string");
    return Format::kText;
  }
  if (messages) {
    if (!line["messages"].is_array()) fail(where, "\"messages\" must be a list of messages");
    return Format::kMessages;
  }
  if (prompt != completion) {
    fail(where, std::string("the line has \"") + (prompt ? "prompt" : "completion") +
                    "\" without \"" + (prompt ? "completion" : "prompt") +
                    "\"; a prompt-completion example needs both");
  }
  if (!prompt) {
    fail(where,
         "the line has none of \"text\", \"prompt\"/\"completion\" or \"messages\"; each line "
         "is one example: {\"text\": ...}, {\"prompt\": ..., \"completion\": ...} or "
         "{\"messages\": [...]}");
  }
  const Json& p = line["prompt"];
  const Json& c = line["completion"];
  if (p.is_string() && c.is_string()) return Format::kPromptCompletion;
  if (p.is_array() && c.is_array()) return Format::kConversationalPromptCompletion;
  fail(where, "\"prompt\" and \"completion\" must both be strings or both be lists of messages");
}

// What every line shares: the tokenizer, the template and the options.
struct Context {
  const std::string& source;
  const Tokenizer& tokenizer;
  const ChatTemplate* chat;
  const DataOptions& options;
  std::optional<std::string> eos;  // the EOS token's text, appended as TRL's add_eos does

  Ids encode(std::string_view text, bool add_special_tokens, const std::string& where) const {
    try {
      return tokenizer.encode(text, add_special_tokens);
    } catch (const InvalidArgument& e) {
      fail(where, e.what());
    }
  }

  std::string render(const Json& messages, bool add_generation_prompt, const Json& extra,
                     const std::string& where) const {
    try {
      return chat->render(messages, add_generation_prompt, extra);
    } catch (const InvalidArgument& e) {
      fail(where, std::string("the chat template refuses the conversation: ") + e.what());
    }
  }
};

// A role the template does not know. The four roles of transformers' chat format are always
// accepted; any other must appear quoted in the template's source ('ipython' in Llama 3.1's), as
// a template that handles a role names it. A role a template names nowhere would be rendered as
// some other role, or under its raw name, silently.
bool templateKnowsRole(const ChatTemplate& chat, const std::string& role) {
  static const char* kBase[] = {"system", "user", "assistant", "tool"};
  for (const char* base : kBase) {
    if (role == base) return true;
  }
  const std::string& source = chat.source();
  return source.find("'" + role + "'") != std::string::npos ||
         source.find("\"" + role + "\"") != std::string::npos;
}

void checkMessages(const Json& messages, const char* field, const Context& c,
                   const std::string& where) {
  if (!messages.is_array() || messages.empty()) {
    fail(where, std::string("\"") + field + "\" must be a non-empty list of messages");
  }
  if (c.chat == nullptr) {
    fail(where,
         "the line is a conversation, and the model folder has no chat template "
         "(tokenizer_config.json's chat_template or chat_template.jinja) to render it");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    const std::string which = std::string("\"") + field + "\"[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      fail(where, which + " is not a message: each is {\"role\": ..., \"content\": ...}");
    }
    const std::string role = m["role"].get<std::string>();
    if (!templateKnowsRole(*c.chat, role)) {
      fail(where, which + " has the role '" + backslashReplaceInvalidUtf8(role) +
                      "', which the chat template does not know (it takes system, user, "
                      "assistant, tool and the roles its source names)");
    }
  }
}

// The template's variables beside `messages`, as TRL passes them: the line's "tools" (a list or
// its JSON text) and its "chat_template_kwargs".
Json templateExtra(const Json& line, const std::string& where) {
  Json extra = Json::object();
  if (line.contains("tools") && !line["tools"].is_null()) {
    Json tools = line["tools"];
    if (tools.is_string()) {
      tools = Json::parse(tools.get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (tools.is_discarded()) fail(where, "\"tools\" is a string that is not JSON");
    }
    extra["tools"] = std::move(tools);
  }
  if (line.contains("chat_template_kwargs")) {
    const Json& kwargs = line["chat_template_kwargs"];
    if (!kwargs.is_object()) fail(where, "\"chat_template_kwargs\" must be an object");
    for (const auto& [key, value] : kwargs.items()) extra[key] = value;
  }
  return extra;
}

Json slice(const Json& messages, size_t count) {
  Json out = Json::array();
  for (size_t i = 0; i < count; ++i) out.push_back(messages[i]);
  return out;
}

TrainingExample textExample(const Json& line, const Context& c, const std::string& where) {
  std::string text = line["text"].get<std::string>();
  if (c.eos && !endsWith(text, *c.eos)) text += *c.eos;
  TrainingExample e;
  e.input_ids = c.encode(text, /*add_special_tokens=*/true, where);
  e.labels = e.input_ids;
  return e;
}

// Labels past the first `prompt_tokens` ids, as TRL's completion_mask.
TrainingExample completionExample(Ids ids, size_t prompt_tokens, const std::string& where) {
  if (prompt_tokens >= ids.size()) {
    fail(where, "the completion gives no tokens; each example needs a completion to train on");
  }
  TrainingExample e;
  e.labels.assign(ids.size(), kIgnoreIndex);
  std::copy(ids.begin() + static_cast<std::ptrdiff_t>(prompt_tokens), ids.end(),
            e.labels.begin() + static_cast<std::ptrdiff_t>(prompt_tokens));
  e.input_ids = std::move(ids);
  return e;
}

TrainingExample promptCompletionExample(const Json& line, const Context& c,
                                        const std::string& where) {
  const std::string prompt = line["prompt"].get<std::string>();
  std::string completion = line["completion"].get<std::string>();
  if (completion.empty()) {
    fail(where, "\"completion\" is empty; each example needs a completion to train on");
  }
  if (c.eos && !endsWith(completion, *c.eos)) completion += *c.eos;
  const Ids prompt_ids = c.encode(prompt, /*add_special_tokens=*/true, where);
  return completionExample(c.encode(prompt + completion, /*add_special_tokens=*/true, where),
                           prompt_ids.size(), where);
}

[[noreturn]] void notPrefixStable(const std::string& where, const std::string& what) {
  fail(where, "the chat template renders " + what +
                  " differently from how it renders it inside the whole conversation, so the "
                  "tokens to train on cannot be told apart (a template that rewrites earlier "
                  "turns, as Qwen3's drops past reasoning, needs a training variant)");
}

TrainingExample conversationalPromptCompletionExample(const Json& line, const Context& c,
                                                      const std::string& where) {
  const Json& prompt = line["prompt"];
  const Json& completion = line["completion"];
  checkMessages(prompt, "prompt", c, where);
  checkMessages(completion, "completion", c, where);
  const Json extra = templateExtra(line, where);
  Json all = prompt;
  for (const auto& m : completion) all.push_back(m);
  const std::string prompt_text = c.render(prompt, /*add_generation_prompt=*/true, extra, where);
  const std::string full = c.render(all, /*add_generation_prompt=*/false, extra, where);
  if (!startsWith(full, prompt_text)) notPrefixStable(where, "the prompt");
  const Ids prompt_ids = c.encode(prompt_text, /*add_special_tokens=*/false, where);
  return completionExample(c.encode(full, /*add_special_tokens=*/false, where), prompt_ids.size(),
                           where);
}

// Each assistant turn k is the text between the rendering of messages[:k] with the generation
// prompt and that of messages[:k+1]: its content and whatever the template writes after it up
// to the next message (the end-of-turn token, Qwen's newline after <|im_end|>). In tokens, the
// span starts at the first token not shared with the tokenized prefix and ends after the last
// token that holds any of its text (transformers' char_to_token rule for {% generation %}).
TrainingExample messagesExample(const Json& line, const Context& c, const std::string& where) {
  const Json& messages = line["messages"];
  checkMessages(messages, "messages", c, where);
  const Json extra = templateExtra(line, where);
  const std::string full = c.render(messages, /*add_generation_prompt=*/false, extra, where);
  TrainingExample e;
  e.input_ids = c.encode(full, /*add_special_tokens=*/false, where);
  e.labels.assign(e.input_ids.size(), kIgnoreIndex);
  bool any_assistant = false;
  for (size_t k = 0; k < messages.size(); ++k) {
    if (messages[k]["role"] != "assistant") continue;
    any_assistant = true;
    const std::string before = c.render(slice(messages, k), true, extra, where);
    const std::string through = c.render(slice(messages, k + 1), false, extra, where);
    if (!startsWith(full, before) || !startsWith(full, through) || through.size() < before.size()) {
      notPrefixStable(where, "the conversation up to message " + std::to_string(k));
    }
    const Ids before_ids = c.encode(before, /*add_special_tokens=*/false, where);
    const Ids through_ids = c.encode(through, /*add_special_tokens=*/false, where);
    const size_t start = commonPrefix(before_ids, e.input_ids);
    const size_t shared = commonPrefix(through_ids, e.input_ids);
    const size_t end =
        std::min(shared == through_ids.size() ? shared : shared + 1, e.input_ids.size());
    for (size_t i = start; i < end; ++i) e.labels[i] = e.input_ids[i];
  }
  if (!any_assistant) {
    fail(where,
         "the conversation has no assistant message; the loss is on the assistant's turns, "
         "so it would train on nothing");
  }
  if (std::all_of(e.labels.begin(), e.labels.end(), [](int32_t l) { return l == kIgnoreIndex; })) {
    fail(where, "the assistant's turns give no tokens, so the example would train on nothing");
  }
  return e;
}

TrainingExample exampleOf(std::string_view text, size_t line_number, std::optional<Format>& format,
                          const Context& c) {
  const std::string where = c.source + ":" + std::to_string(line_number);
  if (!isValidUtf8(text)) fail(where, "the line is not valid UTF-8; JSON lines are UTF-8 text");
  const Json line = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (line.is_discarded() || !line.is_object()) {
    fail(where,
         "the line is not a JSON object; each line of a .jsonl is one example, e.g. "
         "{\"prompt\": ..., \"completion\": ...}");
  }
  const Format f = formatOf(line, where);
  if (!format) format = f;
  if (*format != f) {
    fail(where, std::string("the line is ") + describe(f) + " but the file's first example is " +
                    describe(*format) + "; one file holds one format");
  }
  TrainingExample e;
  switch (f) {
    case Format::kText:
      e = textExample(line, c, where);
      break;
    case Format::kPromptCompletion:
      e = promptCompletionExample(line, c, where);
      break;
    case Format::kConversationalPromptCompletion:
      e = conversationalPromptCompletionExample(line, c, where);
      break;
    case Format::kMessages:
      e = messagesExample(line, c, where);
      break;
  }
  const int64_t max = c.options.max_length;
  if (max > 0 && static_cast<int64_t>(e.input_ids.size()) > max) {
    if (!c.options.truncation) {
      fail(where, "the example is " + std::to_string(e.input_ids.size()) +
                      " tokens, more than --max_length " + std::to_string(max) +
                      "; pass --truncation to keep its first " + std::to_string(max) +
                      " tokens, or raise --max_length");
    }
    e.input_ids.resize(static_cast<size_t>(max));
    e.labels.resize(static_cast<size_t>(max));
  }
  return e;
}

struct Line {
  std::string_view text;
  size_t number;  // 1-based
};

// The lines that hold an example: blank lines (spaces, tabs, "\r") are skipped and keep their
// numbers.
std::vector<Line> examplesLines(std::string_view jsonl) {
  std::vector<Line> lines;
  size_t start = 0, number = 1;
  while (start < jsonl.size()) {
    size_t end = jsonl.find('\n', start);
    if (end == std::string_view::npos) end = jsonl.size();
    const std::string_view text = jsonl.substr(start, end - start);
    if (!isBlank(text)) lines.push_back({text, number});
    start = end + 1;
    ++number;
  }
  return lines;
}

}  // namespace

std::vector<TrainingExample> tokenizeTrainingExamples(std::string_view jsonl,
                                                      const std::string& source,
                                                      const Tokenizer& tokenizer,
                                                      const ChatTemplate* chat,
                                                      const DataOptions& options) {
  if (options.max_length < 0) {
    throw InvalidArgument("--max_length must be 0 (no limit) or more, not " +
                          std::to_string(options.max_length));
  }
  const std::vector<Line> lines = examplesLines(jsonl);
  if (lines.empty()) throw InvalidArgument(source + " holds no examples (no non-blank line)");
  Context c{source, tokenizer, chat, options, std::nullopt};
  if (const auto id = tokenizer.eosId()) c.eos = tokenizer.idToToken(*id);

  // The first line sets the format; the rest are tokenized on several threads. Each thread stops
  // at its first error, and the error of the earliest line is the one thrown, as a sequential
  // read would throw it.
  std::optional<Format> format;
  std::vector<TrainingExample> examples(lines.size());
  examples[0] = exampleOf(lines[0].text, lines[0].number, format, c);
  const size_t threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 16);
  const size_t chunk = std::max<size_t>(64, (lines.size() + threads - 1) / threads);
  std::atomic<size_t> first_error{std::numeric_limits<size_t>::max()};
  std::vector<std::exception_ptr> errors(lines.size() / chunk + 1);
  std::vector<std::thread> workers;
  for (size_t t = 0; t * chunk + 1 < lines.size(); ++t) {
    workers.emplace_back([&, t] {
      std::optional<Format> mine = format;
      const size_t end = std::min(lines.size(), (t + 1) * chunk + 1);
      for (size_t i = t * chunk + 1; i < end && i < first_error.load(); ++i) {
        try {
          examples[i] = exampleOf(lines[i].text, lines[i].number, mine, c);
        } catch (...) {
          errors[t] = std::current_exception();
          size_t seen = first_error.load();
          while (i < seen && !first_error.compare_exchange_weak(seen, i)) {
          }
          return;
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  for (const auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  return examples;
}

std::vector<TrainingExample> readTrainingExamples(const std::string& jsonl_path,
                                                  const Tokenizer& tokenizer,
                                                  const ChatTemplate* chat,
                                                  const DataOptions& options) {
  const std::string data =
      readRegularFile(jsonl_path, "--data", std::numeric_limits<size_t>::max());
  return tokenizeTrainingExamples(data, jsonl_path, tokenizer, chat, options);
}

}  // namespace cxxlaunch::text
