// The `tokenize` program as a user runs it: one JSON array of ids per line, BOS with
// --add_special_tokens, and exit code 2 with one `error:` line and nothing on stdout for a
// user's mistake.

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

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
