#pragma once
// Memory a load fills fastest. A checkpoint's rank files place arrays of 64 KiB and more
// page-aligned (tensorfile::kAlignedArrayBytes), and a load reads them past the page cache
// (O_DIRECT) when the memory it reads into is page-aligned too. How much alignment that takes
// stays here: a strategy asks for such memory, or for its parameter to be moved onto it, and
// knows nothing of the files.
//
// Thread-safety: none needed (free functions).

#include <torch/types.h>

namespace cxxlaunch::runtime::checkpoint {

// An uninitialised float32 CPU tensor for a load to fill, page-aligned (from 2 MiB on, aligned
// to a transparent huge page).
torch::Tensor emptyForReading(at::IntArrayRef sizes);
// The same, zeroed, its pages faulted in at once (state a load may or may not overwrite).
torch::Tensor zerosForReading(at::IntArrayRef sizes);
// Moves `param` (a float32 CPU tensor with its storage to itself, large enough for the files to
// align it) onto memory from emptyForReading, its values copied, so that a load reads into it
// past the page cache; any other tensor is left as it is.
void alignForReading(torch::Tensor& param);

}  // namespace cxxlaunch::runtime::checkpoint
