// tokenize: a model folder's tokenizer.json over a text file, so anyone can diff our ids
// against transformers' (`tok(line, add_special_tokens=...)["input_ids"]`):
//
//   tokenize --model_dir DIR --data FILE [--add_special_tokens]
//
// prints one JSON array of ids per line of FILE: the line without its "\n" (a "\r" before it
// stays, as it does for Python's open(..., newline="\n")); a last line without "\n" counts too.
// Exit codes: 0 done; 2 a user's mistake (a bad flag, a folder without a supported
// tokenizer.json, an unreadable file, a line that is not UTF-8), with one `error:` line on
// stderr and nothing on stdout; 1 anything else (stdout could not be written).

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/command_line.h"
#include "common/error.h"
#include "common/utf8.h"
#include "text/tokenizer.h"

using namespace cxxlaunch;

namespace {

// What is printed per example. Only kIds so far; chat rendering (--render) and the labels
// finetune trains on (--labels) join here, each reading the same examples.
enum class Mode { kIds };

struct Options {
  std::string model_dir;
  std::string data;
  bool add_special_tokens = false;
  Mode mode = Mode::kIds;
};

Options parse(int argc, char** argv) {
  Options o;
  CLI::App app(
      "Prints the ids of each line of a text file as a model folder's tokenizer.json "
      "gives them, one JSON array per line.",
      "tokenize");
  cli::useConventions(app);
  app.add_option(cli::spellings("model_dir"), o.model_dir,
                 "a Hugging Face model folder with tokenizer.json")
      ->required();
  app.add_option(cli::spellings("data"), o.data, "a UTF-8 text file, one example per line")
      ->required();
  app.add_flag(cli::spellings("add_special_tokens"), o.add_special_tokens,
               "add what the tokenizer's post-processor adds (BOS/EOS), as transformers' "
               "add_special_tokens=True");
  cli::parseOrExit(app, argc, argv);
  return o;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument("cannot read --data " + path);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throw InvalidArgument("cannot read --data " + path);
  return buffer.str();
}

// The lines of `text`, each without its "\n"; checked whole before anything is printed.
std::vector<std::string_view> linesOf(const std::string& text, const std::string& path) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.emplace_back(text.data() + start, end - start);
    start = end + 1;
  }
  for (size_t i = 0; i < lines.size(); ++i) {
    if (!isValidUtf8(lines[i])) {
      throw InvalidArgument(path + ":" + std::to_string(i + 1) +
                            ": the line is not valid UTF-8; tokenize reads UTF-8 text");
    }
  }
  return lines;
}

void writeOut(const std::string& out) {
  if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size()) {
    throw Error("cannot write to stdout");
  }
}

int run(const Options& o) {
  const text::Tokenizer tokenizer = text::Tokenizer::fromFolder(o.model_dir);
  const std::string data = readFile(o.data);
  const auto lines = linesOf(data, o.data);
  std::string out;
  for (const auto line : lines) {
    const auto ids = tokenizer.encode(line, o.add_special_tokens);
    out += '[';
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) out += ',';
      out += std::to_string(ids[i]);
    }
    out += "]\n";
    if (out.size() >= (1u << 20)) {
      writeOut(out);
      out.clear();
    }
  }
  writeOut(out);
  if (std::fflush(stdout) != 0) throw Error("cannot write to stdout");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  try {
    return run(options);
  } catch (const InvalidArgument& e) {
    std::cerr << "tokenize: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "tokenize: error: " << e.what() << "\n";
    return 1;
  }
}
