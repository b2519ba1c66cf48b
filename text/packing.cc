#include "text/packing.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "common/error.h"

namespace cxxlaunch::text {
namespace {

// A run of one example's tokens that goes into a row whole: the example, or under kTruncate its
// head, or under kSplit one of its cuts.
struct Piece {
  size_t example;
  size_t begin;
  size_t size;
};

std::vector<Piece> pieces(const std::vector<TrainingExample>& examples,
                          const PackingOptions& options) {
  if (options.length < 1) {
    throw InvalidArgument("the packing length is " + std::to_string(options.length) +
                          "; give a row length of at least 1 token");
  }
  const auto length = static_cast<size_t>(options.length);
  std::vector<Piece> out;
  out.reserve(examples.size());
  for (size_t i = 0; i < examples.size(); ++i) {
    const TrainingExample& e = examples[i];
    const size_t size = e.input_ids.size();
    if (e.labels.size() != size) {
      throw InvalidArgument("example " + std::to_string(i) + " has " + std::to_string(size) +
                            " input ids but " + std::to_string(e.labels.size()) +
                            " labels; give one label per token (-100 where the loss ignores it)");
    }
    if (size == 0) continue;
    if (size <= length) {
      out.push_back({i, 0, size});
      continue;
    }
    switch (options.overlong) {
      case Overlong::kError:
        throw InvalidArgument("example " + std::to_string(i) + " has " + std::to_string(size) +
                              " tokens, more than the row length " + std::to_string(length) +
                              "; truncate the data to the row length or pack with longer rows");
      case Overlong::kTruncate:
        out.push_back({i, 0, length});
        break;
      case Overlong::kSplit:
        for (size_t begin = 0; begin < size; begin += length) {
          out.push_back({i, begin, std::min(length, size - begin)});
        }
        break;
    }
  }
  return out;
}

// `mask_first`: the piece's first label becomes kIgnoreIndex, in a packed row, so that no
// token is trained to predict the next example's first token.
void append(Row& row, const TrainingExample& e, const Piece& piece, bool mask_first) {
  for (size_t k = 0; k < piece.size; ++k) {
    row.input_ids.push_back(e.input_ids[piece.begin + k]);
    row.labels.push_back(k == 0 && mask_first ? kIgnoreIndex : e.labels[piece.begin + k]);
    row.position_ids.push_back(static_cast<int32_t>(k));
  }
  row.examples.push_back(piece.example);
}

// The row's remaining tokens: pad_id, no label, positions `restart` ? 0, 1, ... (a segment of
// their own) : continuing the row's.
void pad(Row& row, const PackingOptions& options, bool restart) {
  const auto length = static_cast<size_t>(options.length);
  int32_t position = restart ? 0 : static_cast<int32_t>(row.position_ids.size());
  while (row.input_ids.size() < length) {
    row.input_ids.push_back(options.pad_id);
    row.labels.push_back(kIgnoreIndex);
    row.position_ids.push_back(position++);
  }
}

Row emptyRow(const PackingOptions& options) {
  Row row;
  const auto length = static_cast<size_t>(options.length);
  row.input_ids.reserve(length);
  row.labels.reserve(length);
  row.position_ids.reserve(length);
  return row;
}

}  // namespace

std::vector<Row> packExamples(const std::vector<TrainingExample>& examples,
                              const PackingOptions& options) {
  const std::vector<Piece> all = pieces(examples, options);
  std::vector<size_t> order(all.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return all[a].size > all[b].size; });
  std::vector<Row> rows;
  // (free tokens, row): the first entry at or above a piece's size is the best fit, and among
  // equal room the row opened first.
  std::set<std::pair<size_t, size_t>> room;
  const auto length = static_cast<size_t>(options.length);
  for (const size_t index : order) {
    const Piece& piece = all[index];
    size_t row = 0, free = 0;
    const auto fit = room.lower_bound({piece.size, size_t{0}});
    if (fit == room.end()) {
      row = rows.size();
      free = length;
      rows.push_back(emptyRow(options));
    } else {
      std::tie(free, row) = *fit;
      room.erase(fit);
    }
    append(rows[row], examples[piece.example], piece, /*mask_first=*/true);
    free -= piece.size;
    if (free > 0) room.insert({free, row});
  }
  for (Row& row : rows) pad(row, options, /*restart=*/true);
  return rows;
}

std::vector<Row> padExamples(const std::vector<TrainingExample>& examples,
                             const PackingOptions& options) {
  std::vector<Row> rows;
  for (const Piece& piece : pieces(examples, options)) {
    rows.push_back(emptyRow(options));
    append(rows.back(), examples[piece.example], piece, /*mask_first=*/false);
    pad(rows.back(), options, /*restart=*/false);
  }
  return rows;
}

}  // namespace cxxlaunch::text
