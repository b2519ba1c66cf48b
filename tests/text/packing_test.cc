// text/packing.h: best-fit-decreasing placement, the labels and positions a packed row needs to
// train as its examples one by one, padding, determinism, and overlong examples; the unpacked
// form. Expected rows are written out by hand.

#include "text/packing.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <random>

#include "common/error.h"

using namespace cxxlaunch;
using namespace cxxlaunch::text;
using Ids = std::vector<int32_t>;

namespace {

constexpr int32_t X = kIgnoreIndex;

// An example of `size` tokens whose ids are base, base + 1, ... and labels the same ids (every
// token trained), so that a token's origin reads off its id.
TrainingExample example(int32_t base, int32_t size) {
  TrainingExample e;
  for (int32_t k = 0; k < size; ++k) e.input_ids.push_back(base + k);
  e.labels = e.input_ids;
  return e;
}

}  // namespace

TEST_CASE("Packing places examples best-fit decreasing, as TRL's bfd", "[text][packing]") {
  // Sizes 5, 3, 4, 2, 6, 1 into rows of 8. Longest first: 6 opens row 0 (room 2), 5 opens row 1
  // (room 3), 4 opens row 2 (room 4), 3 fits row 1 best (room 3 -> 0), 2 fits row 0 best
  // (room 2 -> 0), 1 goes to row 2 (the only room left, 4 -> 3).
  const std::vector<TrainingExample> examples = {example(100, 5), example(200, 3), example(300, 4),
                                                 example(400, 2), example(500, 6), example(600, 1)};
  const auto rows = packExamples(examples, {.length = 8, .pad_id = 7});
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].examples == std::vector<size_t>{4, 3});
  CHECK(rows[1].examples == std::vector<size_t>{0, 1});
  CHECK(rows[2].examples == std::vector<size_t>{2, 5});
  CHECK(rows[0].input_ids == Ids{500, 501, 502, 503, 504, 505, 400, 401});
  CHECK(rows[1].input_ids == Ids{100, 101, 102, 103, 104, 200, 201, 202});
  CHECK(rows[2].input_ids == Ids{300, 301, 302, 303, 600, 7, 7, 7});
  // Each example's positions restart at 0; the padding is a run of its own, from 0 again.
  CHECK(rows[0].position_ids == Ids{0, 1, 2, 3, 4, 5, 0, 1});
  CHECK(rows[1].position_ids == Ids{0, 1, 2, 3, 4, 0, 1, 2});
  CHECK(rows[2].position_ids == Ids{0, 1, 2, 3, 0, 0, 1, 2});
  // Each example's first label is ignored (nothing predicts across examples), as is padding's.
  CHECK(rows[0].labels == Ids{X, 501, 502, 503, 504, 505, X, 401});
  CHECK(rows[1].labels == Ids{X, 101, 102, 103, 104, X, 201, 202});
  CHECK(rows[2].labels == Ids{X, 301, 302, 303, X, X, X, X});
}

TEST_CASE("Best fit: the row with the least room that fits, the first opened among equals",
          "[text][packing]") {
  // Sizes 7, 6, 6, 2, 2 into rows of 10: rows 0 (room 3), 1 (room 4), 2 (room 4). The first 2
  // goes to row 0 (room 3, the least that fits), the second to row 1 (room 4, opened before 2).
  const std::vector<TrainingExample> examples = {example(10, 7), example(20, 6), example(30, 6),
                                                 example(40, 2), example(50, 2)};
  const auto rows = packExamples(examples, {.length = 10});
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].examples == std::vector<size_t>{0, 3});
  CHECK(rows[1].examples == std::vector<size_t>{1, 4});
  CHECK(rows[2].examples == std::vector<size_t>{2});
  // Equal sizes keep their input order (the sort is stable): 20 before 30.
  CHECK(rows[1].input_ids[0] == 20);
  CHECK(rows[2].input_ids[0] == 30);
}

TEST_CASE("Masked labels are kept, every row is the full length, and every token is placed once",
          "[text][packing]") {
  std::mt19937 rng(7);
  std::vector<TrainingExample> examples;
  size_t tokens = 0;
  for (int32_t i = 0; i < 200; ++i) {
    TrainingExample e = example(i * 1000, static_cast<int32_t>(1 + rng() % 64));
    // A prompt of a few tokens under a completion-only loss.
    for (size_t k = 0; k < e.labels.size() / 3; ++k) e.labels[k] = X;
    tokens += e.input_ids.size();
    examples.push_back(std::move(e));
  }
  const PackingOptions options{.length = 64, .pad_id = -1};
  const auto rows = packExamples(examples, options);
  std::vector<int> seen(examples.size(), 0);
  size_t placed = 0, labelled = 0, expected_labelled = 0;
  for (const TrainingExample& e : examples) {
    for (size_t k = 1; k < e.labels.size(); ++k) expected_labelled += e.labels[k] != X;
  }
  for (const Row& row : rows) {
    REQUIRE(row.input_ids.size() == 64);
    REQUIRE(row.labels.size() == 64);
    REQUIRE(row.position_ids.size() == 64);
    CHECK(row.position_ids[0] == 0);
    for (size_t t = 0; t < 64; ++t) {
      if (row.input_ids[t] == -1) {
        CHECK(row.labels[t] == X);
        continue;
      }
      ++placed;
      const int32_t id = row.input_ids[t];
      const auto& e = examples[static_cast<size_t>(id / 1000)];
      const int32_t k = id % 1000;
      CHECK(row.position_ids[t] == k);  // its position within its own example
      CHECK(row.labels[t] == (k == 0 ? X : e.labels[static_cast<size_t>(k)]));
      labelled += row.labels[t] != X;
    }
    for (const size_t i : row.examples) ++seen[i];
  }
  CHECK(placed == tokens);
  // As many labels as the examples run one by one count (their first is dropped by the shift).
  CHECK(labelled == expected_labelled);
  CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  // A row was opened only when no earlier one had room: rooms only shrink, so every row's
  // final room is less than the first example of each row opened after it.
  auto room = [](const Row& row) {
    return std::count(row.input_ids.begin(), row.input_ids.end(), -1);
  };
  for (size_t r = 1; r < rows.size(); ++r) {
    const auto opener = static_cast<long>(examples[rows[r].examples[0]].input_ids.size());
    for (size_t q = 0; q < r; ++q) CHECK(room(rows[q]) < opener);
  }
  // The same input, the same rows.
  const auto again = packExamples(examples, options);
  REQUIRE(again.size() == rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    CHECK(again[r].input_ids == rows[r].input_ids);
    CHECK(again[r].labels == rows[r].labels);
    CHECK(again[r].position_ids == rows[r].position_ids);
    CHECK(again[r].examples == rows[r].examples);
  }
}

TEST_CASE("An example longer than the row: an error, truncated, or split, as asked",
          "[text][packing]") {
  const std::vector<TrainingExample> examples = {example(10, 3), example(100, 10)};
  CHECK_THROWS_MATCHES(packExamples(examples, {.length = 4}), InvalidArgument,
                       Catch::Message("example 1 has 10 tokens, more than the row length 4; "
                                      "truncate the data to the row length or pack with longer "
                                      "rows"));
  CHECK_THROWS_AS(padExamples(examples, {.length = 4}), InvalidArgument);

  const auto truncated = packExamples(examples, {.length = 4, .overlong = Overlong::kTruncate});
  REQUIRE(truncated.size() == 2);
  CHECK(truncated[0].input_ids == Ids{100, 101, 102, 103});
  CHECK(truncated[1].input_ids == Ids{10, 11, 12, 0});

  // Split into 5 + 5, each piece an example of its own (positions restart, first label ignored).
  const auto split = packExamples(examples, {.length = 5, .overlong = Overlong::kSplit});
  REQUIRE(split.size() == 3);
  CHECK(split[0].input_ids == Ids{100, 101, 102, 103, 104});
  CHECK(split[1].input_ids == Ids{105, 106, 107, 108, 109});
  CHECK(split[2].input_ids == Ids{10, 11, 12, 0, 0});
  CHECK(split[1].position_ids == Ids{0, 1, 2, 3, 4});
  CHECK(split[1].labels == Ids{X, 106, 107, 108, 109});
  CHECK(split[0].examples == std::vector<size_t>{1});
  CHECK(split[1].examples == std::vector<size_t>{1});

  // Into 4 + 4 + 2: the pieces are placed as examples, longest first; the 2 left over does not
  // fit beside the 3-token example.
  const auto cut = packExamples(examples, {.length = 4, .overlong = Overlong::kSplit});
  REQUIRE(cut.size() == 4);
  CHECK(cut[1].input_ids == Ids{104, 105, 106, 107});
  CHECK(cut[2].input_ids == Ids{10, 11, 12, 0});
  CHECK(cut[3].input_ids == Ids{108, 109, 0, 0});
  CHECK(cut[3].labels == Ids{X, 109, X, X});
}

TEST_CASE("Bad input is one clear error, and empty examples are left out", "[text][packing]") {
  TrainingExample odd = example(1, 3);
  odd.labels.pop_back();
  CHECK_THROWS_MATCHES(packExamples({example(5, 2), odd}, {.length = 8}), InvalidArgument,
                       Catch::Message("example 1 has 3 input ids but 2 labels; give one label "
                                      "per token (-100 where the loss ignores it)"));
  CHECK_THROWS_MATCHES(packExamples({example(5, 2)}, {.length = 0}), InvalidArgument,
                       Catch::Message("the packing length is 0; give a row length of at least 1 "
                                      "token"));
  const auto rows = packExamples({TrainingExample{}, example(5, 2)}, {.length = 3, .pad_id = 9});
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].examples == std::vector<size_t>{1});
  CHECK(rows[0].input_ids == Ids{5, 6, 9});
  CHECK(packExamples({}, {.length = 3}).empty());
}

TEST_CASE("Unpacked: one example per row, right-padded, labels kept", "[text][packing]") {
  TrainingExample prompted = example(10, 4);
  prompted.labels[0] = prompted.labels[1] = X;
  const auto rows = padExamples({prompted, example(20, 2)}, {.length = 5, .pad_id = 3});
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].input_ids == Ids{10, 11, 12, 13, 3});
  CHECK(rows[0].labels == Ids{X, X, 12, 13, X});
  CHECK(rows[1].input_ids == Ids{20, 21, 3, 3, 3});
  CHECK(rows[1].labels == Ids{20, 21, X, X, X});  // the first is the shift's to drop
  CHECK(rows[1].position_ids == Ids{0, 1, 2, 3, 4});
  CHECK(rows[1].examples == std::vector<size_t>{1});
  const auto split = padExamples({example(30, 7)}, {.length = 3, .overlong = Overlong::kSplit});
  REQUIRE(split.size() == 3);
  CHECK(split[2].input_ids == Ids{36, 0, 0});
}
