#pragma once
// Training examples from a JSON-lines file, tokenized and masked as TRL's SFTTrainer prepares
// them: the ids a causal LM is trained on and, beside them, the labels (the same ids where the
// loss is taken, -100 where it is not; not shifted: the model's loss shifts them).
//
// One example per line, one format per file:
//
//   {"text": "..."}                         language modelling: every token carries loss
//   {"prompt": "...", "completion": "..."}  loss on the completion's tokens only
//   {"prompt": [msgs], "completion": [msgs]} the same, rendered by the chat template
//   {"messages": [msgs]}                    loss on the assistant turns only
//
//   auto tok = cxxlaunch::text::Tokenizer::fromFolder(dir);
//   auto chat = cxxlaunch::text::ChatTemplate::fromFolder(dir);  // if the folder has one
//   auto examples = cxxlaunch::text::readTrainingExamples("train.jsonl", tok, &chat, {});
//
// docs/text.md ("Training data") gives the exact rules and every error. In short, as TRL does:
// text and string completions get the tokenizer's EOS appended (unless they end with it) and
// are tokenized with add_special_tokens=True; conversations are rendered by the template and
// tokenized with add_special_tokens=False; a conversational prompt is rendered with
// add_generation_prompt=True. The assistant turns of `messages` are found by rendering the
// conversation up to each of them (the template must render prefixes as prefixes of the whole).
//
// Errors are InvalidArgument naming "FILE:LINE" (1-based). No LibTorch. Thread-safety: free
// functions over immutable inputs; they tokenize on several threads of their own.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cxxlaunch::text {

class ChatTemplate;
class Tokenizer;

// The label of a token that carries no loss (PyTorch's cross_entropy ignore_index).
inline constexpr int32_t kIgnoreIndex = -100;

struct TrainingExample {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;  // input_ids[i] where the loss is taken, else kIgnoreIndex
};

struct DataOptions {
  // The most tokens an example may have; 0: no limit.
  int64_t max_length = 0;
  // A longer example keeps its first max_length tokens (TRL's truncation_mode="keep_start").
  // Off: a longer example is an InvalidArgument naming its line and length.
  bool truncation = false;
};

// The examples of the JSON-lines file `jsonl_path`. `chat` is the model folder's chat template,
// null when the folder has none (then a conversational line is an InvalidArgument). Throws
// InvalidArgument for an unreadable file and for any bad line (docs/text.md lists them), naming
// the file and the line.
std::vector<TrainingExample> readTrainingExamples(const std::string& jsonl_path,
                                                  const Tokenizer& tokenizer,
                                                  const ChatTemplate* chat,
                                                  const DataOptions& options);

// The same over the file's contents; `source` names it in messages.
std::vector<TrainingExample> tokenizeTrainingExamples(std::string_view jsonl,
                                                      const std::string& source,
                                                      const Tokenizer& tokenizer,
                                                      const ChatTemplate* chat,
                                                      const DataOptions& options);

}  // namespace cxxlaunch::text
