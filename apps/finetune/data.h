#pragma once
// What finetune trains and evaluates on: rows of token ids with their labels and positions, as
// transformers' data collators give them (input_ids, labels with -100 where no loss is taken,
// position_ids), built once from the flags:
//   - a text file (.txt, or any name but .jsonl): cut into blocks of --seq_len, labels =
//     input_ids, positions 0..T-1;
//   - a JSON-lines file (.jsonl): TRL's formats (text/sft_data.h: text, prompt/completion,
//     messages), the loss only where TRL takes it, through the token cache
//     (text/token_cache.h); one example per row, right-padded to the longest, or with
//     --packing several per row of --max_length, positions restarting at each (text/packing.h).
// The last --eval_fraction of the blocks or examples (at least one) is held out.
//
// Thread-safety: none needed (no shared state).

#include <torch/data.h>
#include <torch/types.h>

#include <cstdint>
#include <string>

namespace cxxlaunch::finetune {

// The label of a token that takes no loss (PyTorch's and transformers' ignore_index).
inline constexpr int64_t kIgnoreIndex = -100;

// n rows of T tokens each: input_ids, labels and position_ids, [n, T] int64 each.
struct Rows {
  torch::Tensor input_ids, labels, position_ids;
  // Whether a row holds several examples (positions restart at each): the model is then given
  // position_ids, which make its attention block-diagonal (models/llama.h).
  bool packed = false;
  int64_t size() const { return input_ids.defined() ? input_ids.size(0) : 0; }
  Rows narrow(int64_t begin, int64_t count) const;
  // Rows `indices` (int64 [k]) stacked in that order.
  Rows select(const torch::Tensor& indices) const;
};

struct FinetuneData {
  Rows train, eval;
  int64_t tokens = 0;     // in the source, before cutting
  std::string tokenizer;  // "bytes", "SentencePiece <path>" or "tokenizer.json <path>"
  std::string summary;    // one line for the log: what the rows are and how many
  std::string note;       // the token cache's, when a file was not used or not written
};

struct DataOptions {
  std::string model_dir;  // the tokenizer's folder
  std::string data;       // the file
  int64_t seq_len = 512;
  double eval_fraction = 0.1;
  int64_t vocab_size = 0;               // the model's: ids at or beyond it are refused
  int64_t max_position_embeddings = 0;  // the model's: no row may be longer
  // A .jsonl's (flags.h):
  int64_t max_length = 1024;
  bool truncation = false;
  bool packing = false;
  std::string cache_dir;
};

// The rows of `options.data`: the last eval_fraction of the rows (at least one) held out for
// evaluation. Throws InvalidArgument (naming the file, and the line of a .jsonl) for data that
// cannot be read, a .jsonl example TRL would refuse (text/sft_data.h) or one longer than
// --max_length without --truncation, a .jsonl with a folder that has no tokenizer.json, ids the
// model's vocabulary does not hold, and data that gives fewer than two rows (or examples).
FinetuneData loadData(const DataOptions& options);
// Whether `path` is read as JSON lines (its name ends in .jsonl) rather than as text.
bool isJsonLines(const std::string& path);

// The training rows as a LibTorch dataset: one example is one row, by index.
struct RowExample {
  torch::Tensor input_ids, labels, position_ids;
};
struct RowsDataset : torch::data::datasets::Dataset<RowsDataset, RowExample> {
  explicit RowsDataset(Rows rows) : rows(std::move(rows)) {}
  RowExample get(size_t i) override;
  torch::optional<size_t> size() const override { return static_cast<size_t>(rows.size()); }
  Rows rows;
};

// A batch of examples stacked into rows.
Rows stack(const std::vector<RowExample>& batch);

}  // namespace cxxlaunch::finetune
