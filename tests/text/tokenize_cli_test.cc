// The `tokenize` program as a user runs it: one JSON array of ids per line, BOS with
// --add_special_tokens, and exit code 2 with one `error:` line and nothing on stdout for a
// user's mistake.

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fixtures.h"
#include "support/subprocess.h"

using cxxlaunch::testing::run;
using cxxlaunch::testing::TempDir;

namespace {

void write(const std::string& path, const std::string& content) {
  std::ofstream(path, std::ios::binary) << content;
}

}  // namespace

TEST_CASE("tokenize prints one JSON array of ids per line", "[text][cli]") {
  TempDir dir;
  write(dir.path() + "/tokenizer.json", cxxlaunch::text::fixtures::byteLevelFixture().dump());
  // The last line has no "\n"; the empty line in the middle is an empty example.
  write(dir.path() + "/data.txt", "hello the\n\n<s>a  b\r\nxyz");
  auto out = run({TOKENIZE_BIN, "--model_dir", dir.path(), "--data", dir.path() + "/data.txt"});
  CHECK(out.exit_code == 0);
  CHECK(out.err.empty());
  CHECK(out.out == "[262,258]\n[]\n[300,97,32,266,13]\n[268]\n");
  out = run({TOKENIZE_BIN, "--model-dir=" + dir.path(), "--data", dir.path() + "/data.txt",
             "--add_special_tokens"});
  CHECK(out.exit_code == 0);
  CHECK(out.out == "[300,262,258]\n[300]\n[300,300,97,32,266,13]\n[300,268]\n");
}

TEST_CASE("tokenize: a user's mistake is one error line, exit code 2, nothing printed",
          "[text][cli]") {
  TempDir dir;
  write(dir.path() + "/tokenizer.json", cxxlaunch::text::fixtures::byteLevelFixture().dump());
  write(dir.path() + "/bad.txt", "fine\nnot \xFF utf-8\n");
  auto expectError = [](const cxxlaunch::testing::Finished& f, const std::string& message) {
    CHECK(f.exit_code == 2);
    CHECK(f.out.empty());
    CHECK_THAT(f.err, Catch::StartsWith("tokenize: error: ") && Catch::Contains(message));
    CHECK(std::count(f.err.begin(), f.err.end(), '\n') == 1);
  };
  expectError(run({TOKENIZE_BIN, "--model_dir", dir.path(), "--data", dir.path() + "/bad.txt"}),
              dir.path() + "/bad.txt:2: the line is not valid UTF-8");
  expectError(run({TOKENIZE_BIN, "--model_dir", dir.path(), "--data", dir.path() + "/none.txt"}),
              "cannot read --data " + dir.path() + "/none.txt");
  expectError(run({TOKENIZE_BIN, "--model_dir", dir.path()}), "--data");
  expectError(run({TOKENIZE_BIN, "--model_dir", dir.path() + "/x", "--data", "f"}),
              "no tokenizer.json in " + dir.path() + "/x");
  auto file = cxxlaunch::text::fixtures::byteLevelFixture();
  file["pre_tokenizer"] = {{"type", "Whitespace"}};
  write(dir.path() + "/tokenizer.json", file.dump());
  write(dir.path() + "/ok.txt", "x\n");
  expectError(run({TOKENIZE_BIN, "--model_dir", dir.path(), "--data", dir.path() + "/ok.txt"}),
              "pre_tokenizer type 'Whitespace' is not supported (supported: Split, ByteLevel, "
              "Metaspace, Sequence)");
}

namespace {

// A model folder whose tokenizer_config.json carries the Qwen2.5 template of tests/text/templates.
void writeChatFolder(const std::string& dir, const std::string& template_name) {
  std::ifstream in(std::string(TEXT_TEST_DIR) + "/templates/" + template_name, std::ios::binary);
  std::ostringstream source;
  source << in.rdbuf();
  write(dir + "/tokenizer_config.json",
        nlohmann::json{{"chat_template", source.str()}, {"eos_token", "<|im_end|>"}}.dump());
}

}  // namespace

TEST_CASE("tokenize --render prints each conversation as the chat template renders it",
          "[text][cli][chat]") {
  TempDir dir;
  writeChatFolder(dir.path(), "qwen2.5.jinja");
  // Key order is kept for tojson ("b" before "a"), as Python's json.loads keeps it.
  write(dir.path() + "/chat.jsonl",
        R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "é\n😀"}]})"
        "\n"
        R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "", )"
        R"("tool_calls": [{"function": {"name": "f", "arguments": {"b": 1, "a": "x"}}}]}]})"
        "\n");
  auto out = run(
      {TOKENIZE_BIN, "--model_dir", dir.path(), "--data", dir.path() + "/chat.jsonl", "--render"});
  CHECK(out.exit_code == 0);
  CHECK(out.err.empty());
  const std::string system =
      "<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
      "assistant.<|im_end|>\\n";
  CHECK(out.out ==
        "\"<|im_start|>system\\nS<|im_end|>\\n<|im_start|>user\\né\\n😀<|im_end|>\\n\"\n\"" +
            system +
            "<|im_start|>user\\nQ<|im_end|>\\n<|im_start|>assistant\\n<tool_call>\\n{\\\"name\\\": "
            "\\\"f\\\", \\\"arguments\\\": {\\\"b\\\": 1, \\\"a\\\": \\\"x\\\"}}\\n</tool_call>"
            "<|im_end|>\\n\"\n");
  write(dir.path() + "/one.jsonl", R"({"messages": [{"role": "user", "content": "Hi"}]})");
  out = run({TOKENIZE_BIN, "--model_dir", dir.path(), "--data", dir.path() + "/one.jsonl",
             "--render", "--add_generation_prompt"});
  CHECK(out.exit_code == 0);
  CHECK(out.out ==
        "\"" + system + "<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n\"\n");
}

TEST_CASE("tokenize --render: a bad line or a refused conversation is one error line, exit 2",
          "[text][cli][chat]") {
  TempDir dir;
  writeChatFolder(dir.path(), "mistral-v0.1.jinja");
  auto expectError = [](const cxxlaunch::testing::Finished& f, const std::string& message) {
    CHECK(f.exit_code == 2);
    CHECK(f.out.empty());
    CHECK_THAT(f.err, Catch::StartsWith("tokenize: error: ") && Catch::Contains(message));
    CHECK(std::count(f.err.begin(), f.err.end(), '\n') == 1);
  };
  const std::string ok = R"({"messages": [{"role": "user", "content": "Hi"}]})";
  auto render = [&](const std::string& content) {
    write(dir.path() + "/d.jsonl", content);
    return run(
        {TOKENIZE_BIN, "--model_dir", dir.path(), "--data", dir.path() + "/d.jsonl", "--render"});
  };
  expectError(render(ok + "\n{not json\n"),
              dir.path() + "/d.jsonl:2: the line is not a JSON object");
  expectError(render(ok + "\n" + ok + "\n{\"text\": \"x\"}\n"),
              dir.path() + "/d.jsonl:3: no \"messages\" list");
  expectError(render(ok + "\n" + R"({"messages": [{"role": "assistant", "content": "A"}]})"),
              dir.path() +
                  "/d.jsonl:2: chat_template line 1: raise_exception: Conversation roles "
                  "must alternate user/assistant/user/assistant/...");
  expectError(render(ok + "\n" +
                     R"({"messages": [{"role": "user", "content": "Hi"}, )"
                     R"({"role": "narrator", "content": "x"}]})"),
              "d.jsonl:2: chat_template line 1: raise_exception: Only user and assistant roles "
              "are supported!");
  expectError(run({TOKENIZE_BIN, "--model_dir", dir.path(), "--data", dir.path() + "/d.jsonl",
                   "--add_generation_prompt"}),
              "--add_generation_prompt");
  expectError(run({TOKENIZE_BIN, "--model_dir", dir.path(), "--data", dir.path() + "/d.jsonl",
                   "--render", "--add_special_tokens"}),
              "--add_special_tokens excludes --render");
  write(dir.path() + "/tokenizer_config.json", R"({"chat_template": "{{ x | wordcount }}"})");
  expectError(render(ok), "chat_template line 1: filter 'wordcount' is not supported");
  write(dir.path() + "/tokenizer_config.json", R"({"eos_token": "</s>"})");
  expectError(render(ok), "tokenizer_config.json has no chat_template");
}
