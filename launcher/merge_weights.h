#pragma once
// `cxxlaunch merge-weights CHECKPOINT OUTPUT [--dtype fp32|bf16|fp16] [--max_shard_size 5GB]
// [--overwrite]` and `cxxlaunch merge-weights --lora ADAPTER --base MODEL OUTPUT
// [--max_shard_size SIZE] [--overwrite]`: the command lines of tensorfile/merge_weights.h
// and merge_lora.h, which do the work without LibTorch. A bad command line throws UsageError
// (exit 2).

#include <iosfwd>
#include <string>
#include <vector>

namespace cxxlaunch::launcher {

// Parses the arguments, merges, prints what it wrote on `out` and notes on `err`; returns the
// exit code. Throws InvalidArgument (exit 2) for a bad command line, a missing, incomplete or
// corrupt checkpoint, adapter or base, or an output that is not empty without --overwrite.
int runMergeWeights(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace cxxlaunch::launcher
