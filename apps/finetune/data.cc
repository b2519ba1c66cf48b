#include "apps/finetune/data.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>

#include "apps/examples/tokens.h"
#include "common/error.h"
#ifdef CXXLAUNCH_WITH_TEXT
#include "text/chat_template.h"
#include "text/packing.h"
#include "text/token_cache.h"
#include "text/tokenizer.h"
#endif

namespace cxxlaunch::finetune {

Rows Rows::narrow(int64_t begin, int64_t count) const {
  return {input_ids.narrow(0, begin, count), labels.narrow(0, begin, count),
          position_ids.narrow(0, begin, count), packed};
}

Rows Rows::select(const torch::Tensor& indices) const {
  return {input_ids.index_select(0, indices), labels.index_select(0, indices),
          position_ids.index_select(0, indices), packed};
}

RowExample RowsDataset::get(size_t i) {
  const auto row = static_cast<int64_t>(i);
  return {rows.input_ids[row], rows.labels[row], rows.position_ids[row]};
}

Rows stack(const std::vector<RowExample>& batch) {
  std::vector<torch::Tensor> ids, labels, positions;
  for (const auto& e : batch) {
    ids.push_back(e.input_ids);
    labels.push_back(e.labels);
    positions.push_back(e.position_ids);
  }
  return {torch::stack(ids), torch::stack(labels), torch::stack(positions)};
}

namespace {

FinetuneData textBlocks(const DataOptions& o) {
  // A text file: every line tokenized (apps/examples/tokens.h), the ids cut into blocks of
  // seq_len that are their own labels (the loss shifts them), positions 0..T-1 in each.
  const auto [tokens, tokenizer] = examples::tokenizeFile(o.model_dir, o.data, o.vocab_size);
  const auto total_blocks = static_cast<int64_t>(tokens.size()) / o.seq_len;
  const int64_t eval_blocks = std::max<int64_t>(
      1, static_cast<int64_t>(std::ceil(static_cast<double>(total_blocks) * o.eval_fraction)));
  const int64_t train_blocks = total_blocks - eval_blocks;
  if (train_blocks < 1) {
    throw InvalidArgument("--data '" + o.data + "' holds " + std::to_string(tokens.size()) +
                          " tokens (" + tokenizer + "): " + std::to_string(total_blocks) +
                          " block(s) of --seq_len " + std::to_string(o.seq_len) +
                          "; need at least one to train on and one to evaluate (" +
                          std::to_string(eval_blocks) + " held out by --eval_fraction)");
  }
  const torch::Tensor ids = torch::tensor(tokens, torch::kLong)
                                .narrow(0, 0, total_blocks * o.seq_len)
                                .view({total_blocks, o.seq_len});
  const Rows all{ids, ids.clone(),
                 torch::arange(o.seq_len, torch::kLong).expand({total_blocks, o.seq_len}).clone()};
  FinetuneData data;
  data.train = all.narrow(0, train_blocks);
  data.eval = all.narrow(train_blocks, eval_blocks);
  data.tokens = static_cast<int64_t>(tokens.size());
  data.tokenizer = tokenizer;
  data.summary = std::to_string(tokens.size()) + " tokens (" + tokenizer + "), " +
                 std::to_string(total_blocks) + " blocks of " + std::to_string(o.seq_len) + ": " +
                 std::to_string(train_blocks) + " to train on, " + std::to_string(eval_blocks) +
                 " held out";
  return data;
}

#ifdef CXXLAUNCH_WITH_TEXT
// Rows [n, length] of text::Row's vectors.
Rows rowsOf(const std::vector<text::Row>& rows, int64_t length, bool packed) {
  const auto n = static_cast<int64_t>(rows.size());
  Rows out{torch::empty({n, length}, torch::kLong), torch::empty({n, length}, torch::kLong),
           torch::empty({n, length}, torch::kLong), packed};
  auto ids = out.input_ids.accessor<int64_t, 2>(), labels = out.labels.accessor<int64_t, 2>(),
       positions = out.position_ids.accessor<int64_t, 2>();
  for (int64_t r = 0; r < n; ++r) {
    const text::Row& row = rows[static_cast<size_t>(r)];
    for (int64_t t = 0; t < length; ++t) {
      const auto k = static_cast<size_t>(t);
      ids[r][t] = row.input_ids[k];
      labels[r][t] = row.labels[k];
      positions[r][t] = row.position_ids[k];
    }
  }
  return out;
}

int64_t labelCount(const text::TrainingExample& e) {
  return std::count_if(e.labels.begin(), e.labels.end(),
                       [](int32_t label) { return label != text::kIgnoreIndex; });
}

FinetuneData jsonlExamples(const DataOptions& o) {
  const std::string tokenizer_json = o.model_dir + "/tokenizer.json";
  std::error_code ec;  // a dangling link counts as present: fromFolder then says what it is
  if (!std::filesystem::exists(std::filesystem::symlink_status(tokenizer_json, ec))) {
    throw InvalidArgument("--data '" + o.data + "' is JSON lines, which finetune tokenizes with " +
                          "the folder's tokenizer.json, and " + o.model_dir +
                          " has none: give a folder with a tokenizer.json (Llama 3, Qwen2, ...), "
                          "or the data as a .txt file");
  }
  if (o.max_length > o.max_position_embeddings) {
    throw InvalidArgument("--max_length " + std::to_string(o.max_length) +
                          " is longer than the model's max_position_embeddings " +
                          std::to_string(o.max_position_embeddings) + " (" + o.model_dir +
                          "/config.json)");
  }
  const text::Tokenizer tokenizer = text::Tokenizer::fromFolder(o.model_dir);
  if (tokenizer.vocabSize() > o.vocab_size) {
    throw InvalidArgument(tokenizer_json + " has " + std::to_string(tokenizer.vocabSize()) +
                          " tokens, more than the model's vocab_size " +
                          std::to_string(o.vocab_size));
  }
  const std::optional<text::ChatTemplate> chat = text::ChatTemplate::fromFolderIfAny(o.model_dir);
  text::CachedExamples cached =
      text::loadOrTokenize(o.data, o.model_dir, tokenizer, chat ? &*chat : nullptr,
                           {.max_length = o.max_length, .truncation = o.truncation}, o.cache_dir);
  // An example left without a label (its prompt filled --max_length under --truncation) would
  // train on nothing, and a batch of only such examples has no loss to average: left out, and
  // counted in the summary.
  std::vector<text::TrainingExample> examples;
  examples.reserve(cached.examples.size());
  int64_t label_tokens = 0;
  for (text::TrainingExample& e : cached.examples) {
    for (const int32_t id : e.input_ids) {
      if (id < 0 || id >= o.vocab_size) {
        throw InvalidArgument("--data '" + o.data + "': the tokenizer gave the id " +
                              std::to_string(id) + ", beyond the model's vocab_size " +
                              std::to_string(o.vocab_size));
      }
    }
    const int64_t labels = labelCount(e);
    if (labels == 0) continue;
    label_tokens += labels;
    examples.push_back(std::move(e));
  }
  const auto total = static_cast<int64_t>(examples.size());
  const int64_t dropped = static_cast<int64_t>(cached.examples.size()) - total;
  const int64_t eval_count = std::max<int64_t>(
      1, static_cast<int64_t>(std::ceil(static_cast<double>(total) * o.eval_fraction)));
  if (total - eval_count < 1) {
    throw InvalidArgument("--data '" + o.data + "' holds " + std::to_string(total) +
                          " example(s) with a label to train on; need at least one to train on "
                          "and one to evaluate (" +
                          std::to_string(eval_count) + " held out by --eval_fraction)");
  }
  const std::vector<text::TrainingExample> eval_examples(examples.end() - eval_count,
                                                         examples.end());
  examples.resize(static_cast<size_t>(total - eval_count));
  const int32_t pad = tokenizer.padId().value_or(tokenizer.eosId().value_or(0));
  // Unpacked: each set right-padded to its longest example (at most --max_length).
  auto longest = [](const std::vector<text::TrainingExample>& set) {
    size_t n = 0;
    for (const auto& e : set) n = std::max(n, e.input_ids.size());
    return static_cast<int64_t>(n);
  };
  auto rows = [&](const std::vector<text::TrainingExample>& set) {
    const int64_t length = o.packing ? o.max_length : longest(set);
    const text::PackingOptions options{.length = length, .pad_id = pad};
    return rowsOf(o.packing ? text::packExamples(set, options) : text::padExamples(set, options),
                  length, o.packing);
  };
  FinetuneData data;
  data.train = rows(examples);
  data.eval = rows(eval_examples);
  data.tokens = label_tokens;
  data.tokenizer = "tokenizer.json " + tokenizer_json;
  const int64_t train_rows = data.train.size(), width = data.train.input_ids.size(1);
  data.summary = std::to_string(total) + " examples (" + data.tokenizer + ", " +
                 std::to_string(label_tokens) + " tokens with a label" +
                 (dropped > 0 ? ", " + std::to_string(dropped) + " without one left out" : "") +
                 (cached.cache_hit ? "; read from " : "; cached in ") +
                 (cached.cache_file.empty() ? "no cache" : cached.cache_file) +
                 "): " + std::to_string(train_rows) + (o.packing ? " packed" : "") + " rows of " +
                 std::to_string(width) + " to train on (" + std::to_string(total - eval_count) +
                 " examples), " + std::to_string(eval_count) + " examples held out";
  data.note = cached.note;
  return data;
}
#endif

}  // namespace

bool isJsonLines(const std::string& path) {
  return std::filesystem::path(path).extension() == ".jsonl";
}

FinetuneData loadData(const DataOptions& o) {
  if (!isJsonLines(o.data)) return textBlocks(o);
#ifdef CXXLAUNCH_WITH_TEXT
  return jsonlExamples(o);
#else
  throw InvalidArgument("--data '" + o.data +
                        "' is JSON lines, which need text/ (PCRE2 and ICU): this finetune was "
                        "built without it (scripts/setup.sh installs them)");
#endif
}

}  // namespace cxxlaunch::finetune
