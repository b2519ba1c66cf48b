#pragma once
// Tokenized examples laid out as the rows a causal-LM step trains on, each exactly `length`
// tokens: packed, several examples per row (TRL's packing with its best-fit-decreasing strategy
// and padding-free position ids), or one example per row, right-padded.
//
//   text::PackingOptions options{.length = 2048, .pad_id = pad};
//   for (const text::Row& row : text::packExamples(examples, options)) {
//     // input_ids, labels and position_ids [1, 2048] as int64 tensors, then
//     // models::chunkedCausalLmLoss(model, input_ids, labels, {}, position_ids)
//   }
//
// What a packed row guarantees, with models/llama.h's position_ids (a new example wherever the
// position is 0, attention only within an example): the row trains as its examples would one by
// one, the same loss sum and gradients to rounding. For that:
//   - each example's positions restart at 0, so its rotary positions are its own run's;
//   - each example's first label is -100 (as TRL's DataCollatorWithFlattening sets it): the last
//     token of the example before it would otherwise be trained to predict it, across examples;
//     run alone, the label shift drops that first label anyway, so the count of labels is equal;
//   - the rest of a row is padding: pad_id, labels -100, and positions 0, 1, 2, ... of its own.
//     Restarting makes the padding an example of its own, which no real token attends to (nor
//     would it: it comes after them) and which attends to no real token; its labels are -100, so
//     it adds nothing to the loss and its gradient is zero. Its positions stay below `length`.
//
// Placement is best-fit decreasing, as TRL's "bfd": examples longest first (ties: in input
// order), each into the row with the least room that still fits it (ties: the row opened first),
// a new row when none fits. Rows are in the order they were opened, an example's tokens in the
// order they were placed. The same input gives the same rows, on any machine.
//
// Thread-safety: plain functions over their arguments.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "text/sft_data.h"

namespace cxxlaunch::text {

// One row of `length` tokens.
struct Row {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;
  std::vector<int32_t> position_ids;
  // The input examples this row holds, by index, in row order (a split example once per piece).
  std::vector<size_t> examples;
};

// What an example longer than the row does.
enum class Overlong {
  kError,     // InvalidArgument naming it: for data already held to max_length = length
  kTruncate,  // its first `length` tokens are kept, the rest dropped (TRL's "bfd")
  kSplit,     // cut into pieces of `length` tokens, each an example of its own (positions
              // restart, so a later piece does not see the earlier ones' tokens)
};

struct PackingOptions {
  int64_t length = 0;  // tokens per row, >= 1
  int32_t pad_id = 0;  // the padding's input id (the tokenizer's pad token, or EOS)
  Overlong overlong = Overlong::kError;
};

// Several examples per row, by best-fit decreasing (above). Empty examples are left out (they
// have no token to train on). Throws InvalidArgument for a length < 1, an example whose labels
// are not as long as its input_ids (naming it), and under Overlong::kError an example longer than
// `length` (naming it and both lengths).
std::vector<Row> packExamples(const std::vector<TrainingExample>& examples,
                              const PackingOptions& options);

// One example per row, in input order, right-padded to `length` (pad_id, labels kIgnoreIndex);
// position_ids 0..length-1, as an unpacked row's default. Labels are kept as given (the first is
// dropped by the label shift). Empty examples are left out; errors and overlong examples as
// packExamples' (kSplit: one row per piece).
std::vector<Row> padExamples(const std::vector<TrainingExample>& examples,
                             const PackingOptions& options);

}  // namespace cxxlaunch::text
