// `tokenize --labels` as a user runs it: one {"input_ids", "labels"} per example, exactly what
// readTrainingExamples gives finetune; --max_length and --truncation; a bad line is one `error:`
// line, exit code 2 and nothing on stdout.

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "sft_fixtures.h"
#include "support/subprocess.h"
#include "support/text_lines.h"
#include "text/chat_template.h"
#include "text/sft_data.h"
#include "text/tokenizer.h"

using namespace cxxlaunch::text::fixtures;
using cxxlaunch::testing::run;
using cxxlaunch::testing::TempDir;

namespace {

void expectError(const cxxlaunch::testing::Finished& f, const std::string& message) {
  CHECK(f.exit_code == 2);
  CHECK(f.out.empty());
  CHECK_THAT(f.err, Catch::StartsWith("tokenize: error: ") && Catch::Contains(message));
  CHECK(std::count(f.err.begin(), f.err.end(), '\n') == 1);
}

}  // namespace

TEST_CASE("tokenize --labels prints what finetune trains on", "[text][cli][sft]") {
  TempDir dir;
  writeChatFolder(dir.path());
  const std::string data = dir.path() + "/d.jsonl";
  writeText(data,
            "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, "
            "{\"role\": \"assistant\", \"content\": \"y\"}]}\n\n"
            "{\"messages\": [{\"role\": \"user\", \"content\": \"z\"}, "
            "{\"role\": \"assistant\", \"content\": \"w\"}]}");
  auto out = run({TOKENIZE_BIN, "--model_dir", dir.path(), "--data", data, "--labels"});
  CHECK(out.exit_code == 0);
  CHECK(out.err.empty());
  // <|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\ny<|im_end|>\n, loss on y<|im_end|>\n.
  const std::string user = "303,117,115,101,114,10,";
  const std::string header = "303,97,115,115,105,115,116,97,110,116,10,";
  const std::string masked9 = "-100,-100,-100,-100,-100,-100,-100,-100,-100,";
  const std::string masked11 = masked9 + "-100,-100,";
  CHECK(out.out == "{\"input_ids\": [" + user + "120,304,10," + header +
                       "121,304,10], \"labels\": [" + masked9 + masked11 + "121,304,10]}\n" +
                       "{\"input_ids\": [" + user + "122,304,10," + header +
                       "119,304,10], \"labels\": [" + masked9 + masked11 + "119,304,10]}\n");
  // The same as the library gives, line for line.
  const auto tok = cxxlaunch::text::Tokenizer::fromFolder(dir.path());
  const auto chat = cxxlaunch::text::ChatTemplate::fromFolder(dir.path());
  const auto examples = cxxlaunch::text::readTrainingExamples(data, tok, &chat, {});
  const auto printed = cxxlaunch::testing::lines(out.out);
  REQUIRE(printed.size() == examples.size());
  for (size_t i = 0; i < printed.size(); ++i) {
    const auto line = nlohmann::json::parse(printed[i]);
    CHECK(line["input_ids"].get<std::vector<int32_t>>() == examples[i].input_ids);
    CHECK(line["labels"].get<std::vector<int32_t>>() == examples[i].labels);
  }

  writeText(data, "{\"prompt\": \"Q:\", \"completion\": \" y\"}\n");
  out = run({TOKENIZE_BIN, "--model_dir", dir.path(), "--data", data, "--labels"});
  CHECK(out.out ==
        "{\"input_ids\": [300,81,58,32,121,304], \"labels\": [-100,-100,-100,32,121,304]}\n");
  out = run({TOKENIZE_BIN, "--model_dir", dir.path(), "--data", data, "--labels", "--max_length",
             "4", "--truncation"});
  CHECK(out.exit_code == 0);
  CHECK(out.out == "{\"input_ids\": [300,81,58,32], \"labels\": [-100,-100,-100,32]}\n");
}

TEST_CASE("tokenize --labels: a user's mistake is one error line, exit 2, nothing printed",
          "[text][cli][sft]") {
  TempDir dir;
  writeChatFolder(dir.path());
  const std::string data = dir.path() + "/d.jsonl";
  auto labels = [&](const std::string& content, std::vector<std::string> more = {}) {
    writeText(data, content);
    std::vector<std::string> argv = {TOKENIZE_BIN, "--model_dir", dir.path(),
                                     "--data",     data,          "--labels"};
    argv.insert(argv.end(), more.begin(), more.end());
    return run(argv);
  };
  const std::string ok = "{\"prompt\": \"Q:\", \"completion\": \" y\"}\n";
  expectError(labels(ok + ok, {"--max_length", "5"}),
              data +
                  ":1: the example is 6 tokens, more than --max_length 5; pass --truncation "
                  "to keep its first 5 tokens, or raise --max_length");
  expectError(labels(ok + "{\"text\": \"a\"}\n"),
              data +
                  ":2: the line is {\"text\": ...} but the file's first example is "
                  "{\"prompt\": \"...\", \"completion\": \"...\"}; one file holds one format");
  expectError(labels(ok + "{\"prompt\": \"Q:\", \"completion\": \"\"}\n"),
              data + ":2: \"completion\" is empty");
  expectError(labels(ok + "{\"prompt\": \"\xC3\"}\n"), data + ":2: the line is not valid UTF-8");
  expectError(labels(ok, {"--truncation", "--render"}), "--render excludes --labels");
  expectError(labels(ok, {"--add_special_tokens"}), "--add_special_tokens excludes --labels");
  expectError(run({TOKENIZE_BIN, "--model_dir", dir.path(), "--data", data, "--max_length", "3"}),
              "--max_length requires --labels");
  expectError(labels(ok, {"--max_length", "-1"}), "--max_length");
  writeChatFolder(dir.path(), "");
  expectError(labels("{\"messages\": [{\"role\": \"assistant\", \"content\": \"y\"}]}"),
              data + ":1: the line is a conversation, and the model folder has no chat template");
}

TEST_CASE("tokenize --labels limits the length as finetune does when no --max_length is given",
          "[text][cli][sft]") {
  TempDir dir;
  writeChatFolder(dir.path());
  const std::string data = dir.path() + "/d.jsonl";
  writeText(data, "{\"prompt\": \"" + std::string(40, 'q') + "\", \"completion\": \"r\"}\n");
  // Without config.json: TRL's 1024, which the 43 tokens are within.
  CHECK(run({TOKENIZE_BIN, "--model_dir", dir.path(), "--data", data, "--labels"}).exit_code == 0);
  // With the model's max_position_embeddings below them: that, as finetune's default.
  writeText(dir.path() + "/config.json", "{\"max_position_embeddings\": 16}");
  expectError(run({TOKENIZE_BIN, "--model_dir", dir.path(), "--data", data, "--labels"}),
              "more than --max_length 16");
  CHECK(run({TOKENIZE_BIN, "--model_dir", dir.path(), "--data", data, "--labels", "--max_length",
             "0"})
            .exit_code == 0);
}
