// finetune on JSON lines (docs/finetune.md, "Data"): chat and prompt/completion examples trained
// with the loss where TRL takes it (exactly the labels `tokenize --labels` prints), packing that
// evaluates as the examples one by one, the token cache, and the data's mistakes refused before
// anything is written. The folder's tokenizer is tests/text/sft_fixtures.h's byte-level one with
// ChatML tokens, so that a tiny model (vocabulary 320) holds it.

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "finetune_fixture.h"
#include "support/subprocess.h"
#include "support/text_lines.h"
#include "text/sft_fixtures.h"

using namespace cxxlaunch::testing;
using namespace cxxlaunch::testing::finetune;
namespace fs = std::filesystem;

namespace {

// A tiny Llama whose vocabulary holds the fixture tokenizer's 305 ids, with its tokenizer.json
// and ChatML template.
std::string chatModel(const TempDir& dir) {
  const std::string model = dir.path() + "/chat";
  const Finished init =
      run({LLAMA_INIT_BIN, "--output_dir", model, "--hidden_size", "64", "--intermediate_size",
           "128", "--num_hidden_layers", "2", "--num_attention_heads", "4", "--num_key_value_heads",
           "2", "--vocab_size", "320"});
  INFO(init.out << init.err);
  REQUIRE(init.exit_code == 0);
  cxxlaunch::text::fixtures::writeChatFolder(model);
  return model;
}

// `n` conversations of a system, a user and an assistant turn; the answers vary a little so that
// the eval loss is not zero.
std::string writeChats(const TempDir& dir, int n) {
  const std::string path = dir.path() + "/chat.jsonl";
  std::ofstream out(path);
  for (int i = 0; i < n; ++i) {
    const nlohmann::json line = {
        {"messages",
         {{{"role", "system"}, {"content", "Answer briefly."}},
          {{"role", "user"}, {"content", "What is " + std::to_string(i % 7) + " plus one?"}},
          {{"role", "assistant"}, {"content", "It is " + std::to_string(i % 7 + 1) + "."}}}}};
    out << line.dump() << "\n";
  }
  return path;
}

std::string writeLines(const TempDir& dir, const std::string& name, const std::string& body) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path) << body;
  return path;
}

// finetune's arguments for JSON lines: the fixture's without --seq_len (a text file's), with the
// token cache in `dir`.
Args jsonlArgs(const TempDir& dir, const std::string& model, const std::string& data, int steps,
               const std::string& out) {
  Args args = finetuneArgs(model, data, steps, out);
  const auto seq_len = std::find(args.begin(), args.end(), "--seq_len");
  args.erase(seq_len, seq_len + 2);
  args.insert(args.end(), {"--dataset_cache_dir", dir.path() + "/cache"});
  return args;
}

// The labels that carry loss in `tokenize --labels` output, over every example.
int64_t labelledTokens(const std::string& printed) {
  int64_t count = 0;
  for (const std::string& line : lines(printed)) {
    const nlohmann::json example = nlohmann::json::parse(line);
    for (const auto& label : example["labels"]) count += label != -100;
  }
  return count;
}

// The figure in "N tokens with a label" of finetune's data line.
int64_t reportedLabelled(const std::string& out) {
  std::smatch m;
  REQUIRE(std::regex_search(out, m, std::regex(R"(([0-9]+) tokens with a label)")));
  return std::stoll(m[1]);
}

}  // namespace

TEST_CASE("finetune trains on chat JSON lines with the loss on exactly the labels tokenize prints",
          "[finetune][integration][data]") {
  TempDir dir;
  const std::string model = chatModel(dir);
  const std::string data = writeChats(dir, 40);
  const Finished labels = run({TOKENIZE_BIN, "--model_dir", model, "--data", data, "--labels"});
  INFO(labels.out << labels.err);
  REQUIRE(labels.exit_code == 0);

  const std::string out = dir.path() + "/out";
  const Finished tuned = run(jsonlArgs(dir, model, data, 6, out));
  INFO(tuned.out << tuned.err);
  REQUIRE(tuned.exit_code == 0);
  CHECK_THAT(tuned.out, Catch::Contains("40 examples (tokenizer.json "));
  CHECK(reportedLabelled(tuned.out) == labelledTokens(labels.out));
  const auto losses = evalLosses(tuned.out);
  REQUIRE(losses.size() == 3);
  CHECK(losses[1] < losses[0]);
  CHECK(fs::exists(out + "/config.json"));
  CHECK(fs::exists(out + "/tokenizer_config.json"));

  SECTION("the second run reads the token cache; another tokenizer is not served from it") {
    const Finished again = run(jsonlArgs(dir, model, data, 0, ""));
    INFO(again.out << again.err);
    REQUIRE(again.exit_code == 0);
    CHECK_THAT(again.out, Catch::Contains("; read from " + dir.path() + "/cache/"));
    auto tokenizer = cxxlaunch::text::fixtures::chatTokenizerFixture();
    tokenizer["added_tokens"].push_back({{"id", 305},
                                         {"content", "<|extra|>"},
                                         {"special", true},
                                         {"normalized", false},
                                         {"lstrip", false},
                                         {"rstrip", false},
                                         {"single_word", false}});
    std::ofstream(model + "/tokenizer.json") << tokenizer.dump();
    const Finished other = run(jsonlArgs(dir, model, data, 0, ""));
    INFO(other.out << other.err);
    REQUIRE(other.exit_code == 0);
    CHECK_THAT(other.out, Catch::Contains("; cached in " + dir.path() + "/cache/"));
  }
}

TEST_CASE("Packed rows evaluate as the examples one by one, and a packed run trains under ZeRO-3",
          "[finetune][integration][data]") {
  TempDir dir;
  const std::string model = chatModel(dir);
  std::string body;
  for (int i = 0; i < 30; ++i) {
    body += nlohmann::json{{"prompt", "Count to " + std::to_string(i % 5 + 2) + ":"},
                           {"completion", std::string(" 1 2 3 4 5 6 7").substr(0, 2 * (i % 5 + 2))}}
                .dump() +
            "\n";
  }
  const std::string data = writeLines(dir, "pc.jsonl", body);
  Args plain = jsonlArgs(dir, model, data, 0, "");
  Args packed = plain;
  packed.insert(packed.end(), {"--packing", "--max_length", "64"});
  const Finished one_by_one = run(plain);
  const Finished together = run(packed);
  INFO(one_by_one.out << one_by_one.err << together.out << together.err);
  REQUIRE(one_by_one.exit_code == 0);
  REQUIRE(together.exit_code == 0);
  CHECK_THAT(together.out, Catch::Contains(" packed rows of 64"));
  CHECK(reportedLabelled(together.out) == reportedLabelled(one_by_one.out));
  const auto a = evalLosses(one_by_one.out), b = evalLosses(together.out);
  REQUIRE(a.size() == 1);
  REQUIRE(b.size() == 1);
  CHECK(a[0] == Approx(b[0]).margin(2e-4));  // printed to 4 decimals

  const std::string config = writeConfig(
      dir, "zero3",
      "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n  zero3_init_flag: true\n");
  Args train = jsonlArgs(dir, model, data, 4, dir.path() + "/z3");
  train.insert(train.end(), {"--packing", "--max_length", "64"});
  const Finished z3 = launch(config, train);
  INFO(z3.out << z3.err);
  REQUIRE(z3.exit_code == 0);
  const auto losses = evalLosses(z3.out);
  REQUIRE(losses.size() == 3);
  CHECK(losses[1] < losses[0]);
}

TEST_CASE("finetune refuses bad JSON lines with one error line naming it, exit 2, nothing written",
          "[finetune][integration][data]") {
  TempDir dir;
  const std::string model = chatModel(dir);
  const std::string good = writeChats(dir, 4);
  std::string chats;
  {
    std::ifstream in(good);
    chats.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string too_long =
      nlohmann::json{{"prompt", std::string(300, 'q')}, {"completion", "b"}}.dump() + "\n";
  struct Case {
    const char* what;
    std::string body;
    const char* error;
  };
  const Case cases[] = {
      {"not JSON", chats + "{not json\n", "bad.jsonl:5:"},
      {"no known field", chats + "{\"question\": \"x\"}\n", "bad.jsonl:5:"},
      {"an unknown role",
       "{\"messages\": [{\"role\": \"narrator\", \"content\": \"x\"}, {\"role\": \"assistant\", "
       "\"content\": \"y\"}]}\n",
       "narrator"},
      {"an empty completion", "{\"prompt\": \"x\", \"completion\": \"\"}\n", "empty"},
      {"an example longer than --max_length", chats + too_long, "bad.jsonl:5:"},
  };
  for (const Case& c : cases) {
    SECTION(c.what) {
      const std::string data = writeLines(dir, "bad.jsonl", c.body);
      Args args = jsonlArgs(dir, model, data, 2, dir.path() + "/out");
      args.insert(args.end(), {"--max_length", "256"});
      const Finished refused = run(args);
      INFO(refused.out << refused.err);
      CHECK(refused.exit_code == 2);
      CHECK_THAT(refused.err, Catch::StartsWith("error: ") && Catch::Contains(c.error));
      CHECK(lines(refused.err).size() == 1);
      CHECK_FALSE(fs::exists(dir.path() + "/out"));
      CHECK_FALSE(fs::exists(dir.path() + "/cache"));
    }
  }
  SECTION("a folder without tokenizer.json") {
    const std::string bare = fixture(dir, "bare", {});
    const Finished refused = run(jsonlArgs(dir, bare, good, 2, dir.path() + "/out"));
    CHECK(refused.exit_code == 2);
    CHECK_THAT(refused.err, Catch::Contains("has none: give a folder with a tokenizer.json"));
    CHECK_FALSE(fs::exists(dir.path() + "/out"));
  }
  SECTION("a length flag of the other kind of data") {
    Args args = jsonlArgs(dir, model, good, 2, dir.path() + "/out");
    args.insert(args.end(), {"--seq_len", "32"});
    const Finished jsonl = run(args);
    CHECK(jsonl.exit_code == 2);
    CHECK_THAT(jsonl.err, Catch::Contains("--seq_len cuts a text file into blocks"));
    const std::string text = writeText(dir, 40);
    Args packed = finetuneArgs(model, text, 2, dir.path() + "/out");
    packed.push_back("--packing");
    const Finished txt = run(packed);
    CHECK(txt.exit_code == 2);
    CHECK_THAT(txt.err, Catch::Contains("apply to JSON-lines data"));
    CHECK_FALSE(fs::exists(dir.path() + "/out"));
  }
  SECTION("--max_length beyond the model's positions") {
    Args args = jsonlArgs(dir, model, good, 2, dir.path() + "/out");
    args.insert(args.end(), {"--max_length", "100000"});
    const Finished refused = run(args);
    CHECK(refused.exit_code == 2);
    CHECK_THAT(refused.err, Catch::Contains("longer than the model's max_position_embeddings"));
  }
}
