#pragma once
// Which GPUs the workers see, as accelerate does it: with `--gpus 0,2` (or `gpu_ids: 0,2`) every
// worker gets CUDA_VISIBLE_DEVICES=0,2, so a program that uses cuda:LOCAL_RANK lands on GPUs 0
// and 2. A CUDA_VISIBLE_DEVICES the launcher itself was given keeps its meaning: the ids count
// within it, as CUDA counts, so `CUDA_VISIBLE_DEVICES=4,5,6,7 cxxlaunch run --gpus 0,2` uses
// GPUs 4 and 6 (accelerate would overwrite it and use 0 and 2).

#include <string>
#include <vector>

namespace cxxlaunch::launcher {

// The workers' CUDA_VISIBLE_DEVICES for `gpus` (not empty), given the launcher's own value
// (`inherited`, nullptr when unset). Throws UsageError for an id the inherited list lacks.
std::string visibleDevices(const std::vector<int>& gpus, const char* inherited);

}  // namespace cxxlaunch::launcher
