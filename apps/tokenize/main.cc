// tokenize: a model folder's tokenizer.json and chat template over a data file, so anyone can
// diff our results against transformers':
//
//   tokenize --model_dir DIR --data FILE [--add_special_tokens]
//
// prints one JSON array of ids per line of FILE (`tok(line, add_special_tokens=...)`): the line
// without its "\n" (a "\r" before it stays, as it does for Python's open(..., newline="\n")); a
// last line without "\n" counts too.
//
//   tokenize --model_dir DIR --data FILE.jsonl --render [--add_generation_prompt]
//
// prints, per JSON line {"messages": [...]}, one JSON string: the messages as the folder's chat
// template renders them (`tok.apply_chat_template(messages, tokenize=False, ...)`).
//
//   tokenize --model_dir DIR --data FILE.jsonl --labels [--max_length N] [--truncation]
//
// prints, per example of FILE ({"text"}, {"prompt", "completion"} or {"messages"} lines; blank
// lines skipped), {"input_ids": [...], "labels": [...]}: exactly what finetune trains on
// (text/sft_data.h, docs/text.md "Training data"), with -100 where the loss is masked: the
// prompt, and all but the assistant's turns of a conversation. The same flags give the same
// examples: --max_length defaults to finetune's (1024, at most config.json's
// max_position_embeddings); finetune also leaves out an example without any label.
//
// Exit codes: 0 done; 2 a user's mistake (a bad flag, a folder without a supported
// tokenizer.json or chat template, an unreadable file, a line that is not UTF-8, not JSON or
// without the fields, a conversation the template refuses, an example longer than --max_length
// without --truncation, ...), with one `error:` line on stderr and nothing on stdout; 1 anything
// else (stdout could not be written).

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/command_line.h"
#include "common/error.h"
#include "common/utf8.h"
#include "text/chat_template.h"
#include "text/sft_data.h"
#include "text/tokenizer.h"

using namespace cxxlaunch;

namespace {

// What is printed per example: the ids of each text line, the chat template's rendering of each
// JSON line, or the ids and labels finetune trains on.
enum class Mode { kIds, kRender, kLabels };

struct Options {
  std::string model_dir;
  std::string data;
  bool add_special_tokens = false;
  bool add_generation_prompt = false;
  text::DataOptions data_options;
  Mode mode = Mode::kIds;
};

// finetune's --max_length when none is given: TRL's 1024, at most the model's
// max_position_embeddings (config.json beside the tokenizer, when there is one), so that
// `--labels` prints what finetune trains on under the same flags.
int64_t finetuneMaxLength(const Options& o) {
  constexpr int64_t kTrlMaxLength = 1024;
  std::ifstream in(o.model_dir + "/config.json", std::ios::binary);
  if (!in) return kTrlMaxLength;
  const auto config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  const auto it = config.is_object() ? config.find("max_position_embeddings") : config.end();
  if (it == config.end() || !it->is_number_integer() || it->get<int64_t>() < 1) {
    return kTrlMaxLength;
  }
  return std::min(kTrlMaxLength, it->get<int64_t>());
}

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
  auto* special_flag =
      app.add_flag(cli::spellings("add_special_tokens"), o.add_special_tokens,
                   "add what the tokenizer's post-processor adds (BOS/EOS), as transformers' "
                   "add_special_tokens=True");
  bool render = false;
  auto* render_flag = app.add_flag(cli::spellings("render"), render,
                                   "FILE is JSON lines with \"messages\": print each rendered by "
                                   "the folder's chat template, one JSON string per line");
  app.add_flag(cli::spellings("add_generation_prompt"), o.add_generation_prompt,
               "with --render: end with the assistant's header, as add_generation_prompt=True")
      ->needs(render_flag);
  bool labels = false;
  auto* labels_flag = app.add_flag(
      cli::spellings("labels"), labels,
      "FILE is JSON lines of {\"text\"}, {\"prompt\", \"completion\"} or {\"messages\"}: print "
      "each example as finetune trains on it, {\"input_ids\": [...], \"labels\": [...]} with "
      "-100 where no loss is taken");
  auto* max_length_flag =
      app.add_option(cli::spellings("max_length"), o.data_options.max_length,
                     "with --labels: the most tokens an example may have (0: no limit), as "
                     "finetune's --max_length (default as finetune's: 1024, at most the "
                     "folder's max_position_embeddings)")
          ->needs(labels_flag)
          ->check(CLI::NonNegativeNumber);
  app.add_flag(cli::spellings("truncation"), o.data_options.truncation,
               "with --labels: keep the first --max_length tokens of a longer example instead of "
               "refusing it, as finetune's --truncation")
      ->needs(labels_flag);
  // A rendering is text: the template writes its own BOS. The labels follow TRL's rules for BOS.
  render_flag->excludes(special_flag);
  labels_flag->excludes(special_flag);
  labels_flag->excludes(render_flag);
  cli::parseOrExit(app, argc, argv);
  if (render) o.mode = Mode::kRender;
  if (labels) o.mode = Mode::kLabels;
  if (labels && max_length_flag->count() == 0) o.data_options.max_length = finetuneMaxLength(o);
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

// Writes `out` once it holds a MiB, so that a large file's output is not held whole.
void writeOutIfLarge(std::string& out) {
  if (out.size() < (1u << 20)) return;
  writeOut(out);
  out.clear();
}

// Writes what is left and flushes: a full disk is an error here, not lost at exit.
void finishOut(const std::string& out) {
  writeOut(out);
  if (std::fflush(stdout) != 0) throw Error("cannot write to stdout");
}

// The JSON object on each line of a .jsonl, with key order kept (tojson shows it, as Python's
// json.loads keeps it). `where(k)` names line k for messages.
std::vector<nlohmann::ordered_json> readJsonLines(const std::vector<std::string_view>& lines,
                                                  const std::string& path) {
  std::vector<nlohmann::ordered_json> out;
  for (size_t k = 0; k < lines.size(); ++k) {
    const std::string where = path + ":" + std::to_string(k + 1);
    auto value = nlohmann::ordered_json::parse(lines[k], nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded() || !value.is_object()) {
      throw InvalidArgument(where +
                            ": the line is not a JSON object; each line of a .jsonl "
                            "is one example, e.g. {\"messages\": [...]}");
    }
    out.push_back(std::move(value));
  }
  return out;
}

std::string renderAll(const text::ChatTemplate& chat, const Options& o,
                      const std::vector<std::string_view>& lines) {
  const auto examples = readJsonLines(lines, o.data);
  std::string out;
  for (size_t k = 0; k < examples.size(); ++k) {
    const std::string where = o.data + ":" + std::to_string(k + 1);
    const auto messages = examples[k].find("messages");
    if (messages == examples[k].end() || !messages->is_array()) {
      throw InvalidArgument(where +
                            ": no \"messages\" list; --render reads lines of "
                            "{\"messages\": [{\"role\": ..., \"content\": ...}, ...]}");
    }
    std::string text;
    try {
      text = chat.render(*messages, o.add_generation_prompt);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(where + ": " + e.what());
    }
    out += nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    out += '\n';
  }
  return out;
}

void appendIds(std::string& out, const std::vector<int32_t>& ids) {
  out += '[';
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(ids[i]);
  }
  out += ']';
}

// Every example is made before anything is printed: a bad line prints nothing.
int printLabels(const Options& o) {
  const text::Tokenizer tokenizer = text::Tokenizer::fromFolder(o.model_dir);
  const auto chat = text::ChatTemplate::fromFolderIfAny(o.model_dir);
  const auto examples =
      text::readTrainingExamples(o.data, tokenizer, chat ? &*chat : nullptr, o.data_options);
  std::string out;
  for (const auto& e : examples) {
    out += "{\"input_ids\": ";
    appendIds(out, e.input_ids);
    out += ", \"labels\": ";
    appendIds(out, e.labels);
    out += "}\n";
    writeOutIfLarge(out);
  }
  finishOut(out);
  return 0;
}

int run(const Options& o) {
  if (o.mode == Mode::kLabels) return printLabels(o);
  if (o.mode == Mode::kRender) {
    const text::ChatTemplate chat = text::ChatTemplate::fromFolder(o.model_dir);
    const std::string data = readFile(o.data);
    // Rendered whole before anything is printed: a refused conversation prints nothing.
    finishOut(renderAll(chat, o, linesOf(data, o.data)));
    return 0;
  }
  const text::Tokenizer tokenizer = text::Tokenizer::fromFolder(o.model_dir);
  const std::string data = readFile(o.data);
  const auto lines = linesOf(data, o.data);
  std::string out;
  for (const auto line : lines) {
    appendIds(out, tokenizer.encode(line, o.add_special_tokens));
    out += '\n';
    writeOutIfLarge(out);
  }
  finishOut(out);
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
