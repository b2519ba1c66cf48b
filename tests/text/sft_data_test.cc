// Training examples from JSON lines (text/sft_data.h) on a tokenizer whose ids are worked out by
// hand (sft_fixtures.h): which tokens carry loss for each format, EOS as TRL's add_eos adds it,
// truncation, and every bad line as an InvalidArgument naming the file and the line.

#include "text/sft_data.h"

#include <catch2/catch.hpp>

#include "common/error.h"
#include "sft_fixtures.h"
#include "support/subprocess.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

using namespace cxxlaunch::text;
using namespace cxxlaunch::text::fixtures;
using cxxlaunch::InvalidArgument;
using cxxlaunch::testing::TempDir;
using Ids = std::vector<int32_t>;

namespace {

struct Folder {
  TempDir dir;
  Tokenizer tok;
  std::optional<ChatTemplate> chat;
  explicit Folder(const std::string& chat_template = kChatMl)
      : tok((writeChatFolder(dir.path(), chat_template), Tokenizer::fromFolder(dir.path()))),
        chat(ChatTemplate::fromFolderIfAny(dir.path())) {}

  std::vector<TrainingExample> read(const std::string& jsonl, DataOptions options = {}) const {
    return tokenizeTrainingExamples(jsonl, "data.jsonl", tok, chat ? &*chat : nullptr, options);
  }
  TrainingExample one(const std::string& line, DataOptions options = {}) const {
    auto examples = read(line, options);
    REQUIRE(examples.size() == 1);
    return examples[0];
  }
};

// One turn of the ChatML template, "<|im_start|>ROLE\nCONTENT<|im_end|>\n", in ids.
Ids turn(const std::string& role, const std::string& content) {
  return concat({{kImStart}, bytesOf(role), {kNewline}, bytesOf(content), {kImEnd, kNewline}});
}

// The same with the loss on what follows the generation prompt "<|im_start|>assistant\n".
Ids assistantLabels(const std::string& content) {
  return concat({masked(1 + 9 + 1), bytesOf(content), {kImEnd, kNewline}});
}

// The message of the InvalidArgument that reading `jsonl` throws.
std::string errorOf(const Folder& f, const std::string& jsonl) {
  try {
    f.read(jsonl);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  FAIL("no InvalidArgument");
  return "";
}

void expectError(const Folder& f, const std::string& jsonl, const std::string& message,
                 DataOptions options = {}) {
  CHECK_THROWS_MATCHES(f.read(jsonl, options), InvalidArgument, Catch::Message(message));
}

}  // namespace

TEST_CASE("text: every token carries loss, and EOS ends it as TRL's add_eos", "[text][sft]") {
  Folder f;
  // <s> from the post-processor (add_special_tokens=True), then the text, then <|im_end|>.
  auto e = f.one(R"({"text": "Hi you"})");
  const Ids ids = concat({{kBos}, bytesOf("Hi you"), {kImEnd}});
  CHECK(e.input_ids == ids);
  CHECK(e.labels == ids);
  // A text that already ends with the EOS gets no second one.
  e = f.one(R"({"text": "Hi<|im_end|>"})");
  CHECK(e.input_ids == Ids{kBos, 'H', 'i', kImEnd});
  // A tokenizer without eos_token: nothing is appended.
  writeText(f.dir.path() + "/tokenizer_config.json", "{}");
  const auto bare = Tokenizer::fromFolder(f.dir.path());
  const auto examples = tokenizeTrainingExamples(R"({"text": "Hi"})", "d", bare, nullptr, {});
  CHECK(examples[0].input_ids == Ids{kBos, 'H', 'i'});
}

TEST_CASE("prompt-completion strings: the loss is on the tokens past the prompt's", "[text][sft]") {
  Folder f;
  auto e = f.one(R"({"prompt": "Q:", "completion": " y"})");
  CHECK(e.input_ids == Ids{kBos, 'Q', ':', ' ', 'y', kImEnd});
  CHECK(e.labels == Ids{-100, -100, -100, ' ', 'y', kImEnd});
  // As TRL: the mask is the length of the prompt's own ids, even where the prompt's last token
  // merges with the completion's first ("he" + "llo" is one token, 262 "hello"): the prompt's
  // two ids (<s>, "he") are masked, so "hello" carries no loss.
  e = f.one(R"({"prompt": "he", "completion": "llo"})");
  CHECK(e.input_ids == Ids{kBos, 262, kImEnd});
  CHECK(e.labels == Ids{-100, -100, kImEnd});
}

TEST_CASE("prompt-completion conversations: the prompt is rendered with the generation prompt",
          "[text][sft]") {
  Folder f;
  const auto e = f.one(R"({"prompt": [{"role": "user", "content": "x"}],)"
                       R"( "completion": [{"role": "assistant", "content": "y"}]})");
  CHECK(e.input_ids == concat({turn("user", "x"), turn("assistant", "y")}));
  // No BOS (the template writes its own) and no EOS appended (the template ends the turn).
  CHECK(e.labels == concat({masked(turn("user", "x").size()), assistantLabels("y")}));
}

TEST_CASE("messages: only the assistant turns carry loss, their end-of-turn tokens included",
          "[text][sft]") {
  Folder f;
  const auto e =
      f.one(R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "x"},)"
            R"( {"role": "assistant", "content": "y"}, {"role": "user", "content": "z"},)"
            R"( {"role": "assistant", "content": "w"}], "id": 7})");
  CHECK(e.input_ids == concat({turn("system", "S"), turn("user", "x"), turn("assistant", "y"),
                               turn("user", "z"), turn("assistant", "w")}));
  CHECK(e.labels ==
        concat({masked(turn("system", "S").size() + turn("user", "x").size()), assistantLabels("y"),
                masked(turn("user", "z").size()), assistantLabels("w")}));
}

TEST_CASE("messages: a token that holds both header and content text is trained on",
          "[text][sft]") {
  Folder f;
  // "\n\n" is one token (267): the header's newline and the content's first character.
  const auto e = f.one(
      R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "\ny"}]})");
  const Ids assistant = concat({{kImStart}, bytesOf("assistant"), {267, 'y', kImEnd, kNewline}});
  CHECK(e.input_ids == concat({turn("user", "x"), assistant}));
  CHECK(e.labels == concat({masked(turn("user", "x").size() + 10), {267, 'y', kImEnd, kNewline}}));
}

TEST_CASE("messages: tools and chat_template_kwargs reach the template", "[text][sft]") {
  Folder f(
      "{% if tools %}T{{ tools | length }}{% endif %}{% if flag %}F{% endif %}"
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}");
  const std::string conversation =
      R"("messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}])";
  auto e = f.one("{" + conversation + R"(, "tools": "[{\"name\": \"f\"}]"})");
  CHECK(e.input_ids == concat({{'T', '1'}, turn("user", "x"), turn("assistant", "y")}));
  e = f.one("{" + conversation + R"(, "chat_template_kwargs": {"flag": true}})");
  CHECK(e.input_ids == concat({{'F'}, turn("user", "x"), turn("assistant", "y")}));
  CHECK(e.labels == concat({masked(1 + turn("user", "x").size()), assistantLabels("y")}));
}

TEST_CASE("truncation keeps the start, and without it a long example names its line",
          "[text][sft]") {
  Folder f;
  const std::string jsonl =
      "{\"prompt\": \"Q\", \"completion\": \"y\"}\n{\"prompt\": \"Q:\", \"completion\": \" y\"}";
  expectError(f, jsonl,
              "data.jsonl:2: the example is 6 tokens, more than --max_length 4; pass "
              "--truncation to keep its first 4 tokens, or raise --max_length",
              {.max_length = 4});
  // The line that is too long is named, not the first.
  expectError(f,
              "{\"prompt\": \"Q:\", \"completion\": \" y\"}\n{\"prompt\": \"Q:\", "
              "\"completion\": \" yyy\"}",
              "data.jsonl:2: the example is 8 tokens, more than "
              "--max_length 6; pass --truncation to keep its first 6 tokens, or raise "
              "--max_length",
              {.max_length = 6});
  const auto examples =
      f.read("{\"prompt\": \"Q:\", \"completion\": \" y\"}", {.max_length = 4, .truncation = true});
  CHECK(examples[0].input_ids == Ids{kBos, 'Q', ':', ' '});
  CHECK(examples[0].labels == Ids{-100, -100, -100, ' '});
  // At the limit exactly: kept whole.
  CHECK(f.read(jsonl.substr(jsonl.find('\n') + 1), {.max_length = 6})[0].input_ids.size() == 6);
}

TEST_CASE("a bad line is an InvalidArgument naming the file and the line", "[text][sft]") {
  Folder f;
  const std::string ok = R"({"text": "a"})";
  // Blank lines are skipped and keep their numbers.
  expectError(f, ok + "\n\n  \r\n{\"text\": ",
              "data.jsonl:4: the line is not a JSON object; "
              "each line of a .jsonl is one example, e.g. {\"prompt\": ..., \"completion\": ...}");
  expectError(f, ok + "\n[1, 2]",
              "data.jsonl:2: the line is not a JSON object; each line of a "
              ".jsonl is one example, e.g. {\"prompt\": ..., \"completion\": ...}");
  expectError(f, ok + "\n{\"text\": \"\xff\"}",
              "data.jsonl:2: the line is not valid UTF-8; JSON lines are UTF-8 text");
  expectError(f, R"({"txt": "a"})",
              "data.jsonl:1: the line has none of \"text\", \"prompt\"/\"completion\" or "
              "\"messages\"; each line is one example: {\"text\": ...}, {\"prompt\": ..., "
              "\"completion\": ...} or {\"messages\": [...]}");
  expectError(f, R"({"prompt": "a"})",
              "data.jsonl:1: the line has \"prompt\" without \"completion\"; a prompt-completion "
              "example needs both");
  expectError(f, R"({"text": 3})", "data.jsonl:1: \"text\" must be a string");
  expectError(f, R"({"text": "a", "messages": []})",
              "data.jsonl:1: the line has more than one of \"text\", \"messages\" and "
              "\"prompt\"/\"completion\"; each line is one example of one format");
  expectError(f, R"({"prompt": "a", "completion": [{"role": "assistant", "content": "b"}]})",
              "data.jsonl:1: \"prompt\" and \"completion\" must both be strings or both be lists "
              "of messages");
  expectError(f, ok + "\n" + R"({"prompt": "a", "completion": "b"})",
              "data.jsonl:2: the line is {\"prompt\": \"...\", \"completion\": \"...\"} but the "
              "file's first example is {\"text\": ...}; one file holds one format");
  expectError(f, R"({"prompt": "a", "completion": ""})",
              "data.jsonl:1: \"completion\" is empty; each example needs a completion to train on");
  expectError(f, R"({"prompt": [{"role": "user", "content": "a"}], "completion": []})",
              "data.jsonl:1: \"completion\" must be a non-empty list of messages");
  expectError(f, R"({"messages": [{"role": "user", "content": "a"}]})",
              "data.jsonl:1: the conversation has no assistant message; the loss is on the "
              "assistant's turns, so it would train on nothing");
  expectError(f, R"({"messages": [{"content": "a"}]})",
              "data.jsonl:1: \"messages\"[0] is not a message: each is {\"role\": ..., "
              "\"content\": ...}");
  expectError(f, "", "data.jsonl holds no examples (no non-blank line)");
}

TEST_CASE("a role the template does not know is refused, and one it names is taken",
          "[text][sft]") {
  Folder f;
  const std::string bot =
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]})";
  expectError(f, bot,
              "data.jsonl:1: \"messages\"[1] has the role 'bot', which the chat template does "
              "not know (it takes system, user, assistant, tool and the roles its source names)");
  // A template that names the role (as Llama 3.1's names 'ipython') renders it.
  Folder named(std::string("{# roles: 'bot' #}") + kChatMl);
  const auto e = named.one(
      R"({"messages": [{"role": "bot", "content": "b"}, {"role": "assistant", "content": "y"}]})");
  CHECK(e.input_ids == concat({turn("bot", "b"), turn("assistant", "y")}));
}

TEST_CASE("a conversation without a chat template, or one the template refuses, names its line",
          "[text][sft]") {
  Folder none("");
  CHECK_FALSE(none.chat.has_value());
  const std::string chat =
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})";
  expectError(none, chat,
              "data.jsonl:1: the line is a conversation, and the model folder has no chat "
              "template (tokenizer_config.json's chat_template or chat_template.jinja) to render "
              "it");
  // Text needs no template.
  CHECK(none.read(R"({"text": "a"})").size() == 1);
  Folder strict(
      "{% if messages[0].role != 'system' %}{{ raise_exception('need a system') }}"
      "{% endif %}" +
      std::string(kChatMl));
  CHECK_THAT(errorOf(strict, chat),
             Catch::StartsWith("data.jsonl:1: the chat template refuses the conversation: ") &&
                 Catch::Contains("need a system"));
}

TEST_CASE("a template that renders earlier turns differently is refused for messages",
          "[text][sft]") {
  // The last message is marked: the conversation up to the first assistant turn renders that
  // turn with the mark, the whole conversation does not.
  Folder f(
      "{% for m in messages %}{% if loop.last %}L{% endif %}<|im_start|>{{ m.role }}\n"
      "{{ m.content }}<|im_end|>\n{% endfor %}"
      "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}");
  CHECK_THAT(
      errorOf(f, R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", )"
                 R"("content": "y"}, {"role": "user", "content": "z"}, {"role": "assistant", )"
                 R"("content": "w"}]})"),
      Catch::StartsWith("data.jsonl:1: the chat template renders the conversation up to "
                        "message 1 differently"));
}

TEST_CASE("many lines: the examples keep the file's order and the first bad line is named",
          "[text][sft]") {
  Folder f;
  std::string jsonl;
  for (int i = 0; i < 500; ++i) {
    jsonl += "{\"text\": \"" + std::string(static_cast<size_t>(i % 7 + 1), 'x') + "\"}\n";
  }
  const auto examples = f.read(jsonl);
  REQUIRE(examples.size() == 500);
  for (size_t i = 0; i < examples.size(); ++i) {
    CHECK(examples[i].input_ids.size() == i % 7 + 1 + 2);
  }
  std::string bad = jsonl;
  auto lineStart = [&](int n) {  // 1-based
    size_t at = 0;
    for (int k = 1; k < n; ++k) at = bad.find('\n', at) + 1;
    return at;
  };
  bad.replace(lineStart(450), 1, "[");
  bad.replace(lineStart(120), 1, "[");
  CHECK_THAT(errorOf(f, bad), Catch::StartsWith("data.jsonl:120: "));
}

TEST_CASE("readTrainingExamples names the file", "[text][sft]") {
  Folder f;
  writeText(f.dir.path() + "/d.jsonl", "{\"text\": \"a\"}\n{\"text\": 1}\n");
  CHECK_THROWS_MATCHES(readTrainingExamples(f.dir.path() + "/d.jsonl", f.tok, nullptr, {}),
                       InvalidArgument,
                       Catch::Message(f.dir.path() + "/d.jsonl:2: \"text\" must be a string"));
  CHECK_THROWS_AS(readTrainingExamples(f.dir.path() + "/none.jsonl", f.tok, nullptr, {}),
                  InvalidArgument);
}
