// eval_worker: the Accelerator's evaluation helpers in a real process of a launched world,
// checked against closed forms; exits 1 naming the first thing that differs.
//   eval_worker N:B [N:B ...]
// For each dataset of N examples (example i: data [i, -i], target i) and per-process batch B:
// prepareEvalDataLoader gives every rank ceil(N / (world * B)) full batches; gatherForMetrics of
// the data and of the targets (twice per batch, as an evaluation gathers predictions and labels)
// gives 0..N-1 exactly, in order, in two passes. Then reduce (sum, mean), padAcrossProcesses (at
// the end and at the start) and splitBetweenProcesses (vectors and tensors; their shares padded,
// gathered and joined give the items once, in order). Prints "rank R: eval ok" at the end.

#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/accelerator.h"

using cxxlaunch::runtime::Accelerator;

namespace {

struct Indexed : torch::data::datasets::Dataset<Indexed> {
  explicit Indexed(size_t n) : n(n) {}
  torch::data::Example<> get(size_t i) override {
    const auto v = static_cast<float>(i);
    return {torch::tensor({v, -v}), torch::tensor(static_cast<int64_t>(i))};
  }
  torch::optional<size_t> size() const override { return n; }
  size_t n;
};

int failures = 0;
void expect(bool ok, const std::string& what, int rank) {
  if (ok) return;
  std::cerr << "rank " << rank << ": FAILED " << what << std::endl;
  ++failures;
}

void checkDataset(Accelerator& acc, int64_t n, int64_t b) {
  const int64_t world = acc.worldSize();
  const std::string where = "N=" + std::to_string(n) + " B=" + std::to_string(b);
  auto loader = acc.prepareEvalDataLoader(
      Indexed(static_cast<size_t>(n)).map(torch::data::transforms::Stack<>()),
      static_cast<size_t>(b));
  const int64_t batches = (n + world * b - 1) / (world * b);
  expect(loader->batchesPerProcess() == batches, where + ": batchesPerProcess", acc.rank());
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<torch::Tensor> data, targets;
    int64_t seen = 0;
    for (auto& batch : *loader) {
      ++seen;
      expect(batch.data.size(0) == b, where + ": a batch that is not full", acc.rank());
      data.push_back(acc.gatherForMetrics(batch.data));
      targets.push_back(acc.gatherForMetrics(batch.target));
    }
    expect(seen == batches,
           where + ": " + std::to_string(seen) + " batches, not " + std::to_string(batches),
           acc.rank());
    const auto expected = torch::arange(n, torch::kInt64);
    const auto all_targets =
        targets.empty() ? torch::empty({0}, torch::kInt64) : torch::cat(targets);
    const auto all_data = data.empty() ? torch::empty({0, 2}) : torch::cat(data);
    expect(all_targets.equal(expected),
           where + ": gathered targets are not 0..N-1 in order (got " +
               std::to_string(all_targets.numel()) + ")",
           acc.rank());
    expect(all_data.size(0) == n && all_data.select(1, 0).equal(expected.to(torch::kFloat)) &&
               all_data.select(1, 1).equal(-expected.to(torch::kFloat)),
           where + ": gathered data rows are not the dataset's", acc.rank());
  }
  // Outside the loop, gatherForMetrics is gather: every rank's rows.
  const auto plain = acc.gatherForMetrics(torch::full({b}, acc.rank(), torch::kInt64));
  expect(plain.size(0) == world * b, where + ": gatherForMetrics after the loop cut rows",
         acc.rank());
}

void checkCollectives(Accelerator& acc) {
  const int64_t world = acc.worldSize(), rank = acc.rank();
  // reduce: rank r gives [r + 1, 2 (r + 1)].
  const auto mine = torch::tensor({static_cast<double>(rank + 1), 2.0 * (rank + 1)});
  const double s = static_cast<double>(world * (world + 1) / 2);
  expect(acc.reduce(mine, "sum").equal(torch::tensor({s, 2 * s})), "reduce sum", acc.rank());
  expect(acc.reduce(mine, "mean").allclose(torch::tensor({s / world, 2 * s / world})),
         "reduce mean", acc.rank());
  expect(acc.reduce(torch::tensor({int64_t{1}}), "sum").item<int64_t>() == world,
         "reduce of integers", acc.rank());
  expect(mine.equal(torch::tensor({static_cast<double>(rank + 1), 2.0 * (rank + 1)})),
         "reduce changed its input", acc.rank());
  try {
    acc.reduce(mine, "max");
    expect(false, "reduce accepted 'max'", acc.rank());
  } catch (const cxxlaunch::InvalidArgument&) {
  }
  // padAcrossProcesses: rank r has r + 1 rows of value r (2 columns); padded to `world` rows.
  const auto rows = torch::full({rank + 1, 2}, static_cast<float>(rank));
  for (const bool first : {false, true}) {
    const auto padded = acc.padAcrossProcesses(rows, 0, -1, first);
    expect(padded.size(0) == world && padded.size(1) == 2, "padAcrossProcesses shape", acc.rank());
    const auto gathered = acc.gather(padded).view({world, world, 2});
    for (int64_t r = 0; r < world; ++r) {
      for (int64_t i = 0; i < world; ++i) {
        const bool real = first ? i >= world - (r + 1) : i < r + 1;
        const float want = real ? static_cast<float>(r) : -1.f;
        expect(gathered[r][i][0].item<float>() == want && gathered[r][i][1].item<float>() == want,
               "padAcrossProcesses value at rank " + std::to_string(r) + " row " +
                   std::to_string(i) + (first ? " (pad_first)" : ""),
               acc.rank());
      }
    }
  }
  // Along another dim: [2, r + 1] grown to [2, world].
  const auto wide = acc.padAcrossProcesses(torch::ones({2, rank + 1}), 1, 0);
  expect(wide.size(1) == world && wide.sum().item<float>() == 2.f * (rank + 1),
         "padAcrossProcesses along dim 1", acc.rank());
  // splitBetweenProcesses: 0..count-1 split; every share padded with -1, gathered, joined.
  for (const int64_t count : {int64_t{0}, int64_t{1}, world + 1, 7 * world + world - 1}) {
    std::vector<int64_t> items(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) items[static_cast<size_t>(i)] = i;
    const auto share = acc.splitBetweenProcesses(items);
    const auto tensor_share = acc.splitBetweenProcesses(torch::arange(count, torch::kInt64));
    expect(tensor_share.equal(torch::tensor(share, torch::kInt64)),
           "splitBetweenProcesses: the tensor's share differs from the vector's", acc.rank());
    const auto sizes = acc.gather(torch::tensor({static_cast<int64_t>(share.size())}));
    expect(sizes.max().item<int64_t>() - sizes.min().item<int64_t>() <= 1,
           "splitBetweenProcesses: shares differ by more than one", acc.rank());
    const auto padded = acc.padAcrossProcesses(tensor_share, 0, -1);
    const auto joined = acc.gather(padded);
    const auto real = joined.masked_select(joined.ge(0));
    expect(real.equal(torch::arange(count, torch::kInt64)),
           "splitBetweenProcesses of " + std::to_string(count) + " items: not each once in order",
           acc.rank());
  }
}

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);
  int rank = -1;
  try {
    Accelerator acc;
    rank = acc.rank();
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      const auto colon = arg.find(':');
      checkDataset(acc, std::stoll(arg.substr(0, colon)), std::stoll(arg.substr(colon + 1)));
    }
    checkCollectives(acc);
    acc.waitForEveryone();
    if (failures > 0) return 1;
    std::cout << "rank " << rank << ": eval ok" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": " << e.what() << std::endl;
    return 3;
  }
}
