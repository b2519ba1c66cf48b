#include "apps/finetune/data.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "apps/examples/tokens.h"
#include "common/error.h"

namespace cxxlaunch::finetune {

Rows Rows::narrow(int64_t begin, int64_t count) const {
  return {input_ids.narrow(0, begin, count), labels.narrow(0, begin, count),
          position_ids.narrow(0, begin, count)};
}

Rows Rows::select(const torch::Tensor& indices) const {
  return {input_ids.index_select(0, indices), labels.index_select(0, indices),
          position_ids.index_select(0, indices)};
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

FinetuneData loadData(const DataOptions& o) {
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

}  // namespace cxxlaunch::finetune
