#pragma once
// `cxxlaunch merge-weights`, accelerate's merge-weights: a checkpoint of any strategy, layout and
// world size (runtime/checkpoint/checkpoint.h) -> the model's parameters and buffers as
// safetensors, the layout `transformers` reads (model.safetensors, or
// model-0000k-of-0000n.safetensors with model.safetensors.index.json). Optimizer state, counters
// and generators are not written.
//
// Streamed: each tensor is read from the rank files a block at a time (every chunk's CRC-32C
// checked as it is read), converted, and appended to its output file, so memory stays within
// a few blocks whatever the model's size. Nothing is half-done: the files are written into a
// staging folder beside the output, which is renamed to the output once every file is complete;
// a corrupt checkpoint (a chunk that fails its checksum) stops it before the rename.
// When the checkpoint's job loaded a model folder (Accelerator::loadModel: manifest counter
// model_source), that folder's config.json and tokenizer files (model_folder.h) are copied too,
// so that the output is a model folder again; a folder that is gone is a warning. OUTPUT may not
// be, contain or lie inside the checkpoint; leftovers of killed merges into the same OUTPUT are
// removed (merge_output.h). No LibTorch: the launcher links it.
//
// Thread-safety: none; one call at a time per output.

#include <cstdint>
#include <string>
#include <vector>

namespace cxxlaunch::tensorfile {

struct MergeWeightsOptions {
  std::string checkpoint;     // a checkpoint directory, or a folder of them (the newest complete)
  std::string output;         // the folder to write; refused when it exists and is not empty ...
  bool overwrite = false;     // ... unless this is set
  std::string dtype = "F32";  // F32, BF16 or F16 (safetensors' names)
  uint64_t max_file_bytes = 5'000'000'000;  // of tensor data per file, as HF's "5GB"
};

struct MergeWeightsResult {
  std::string checkpoint;             // the checkpoint directory read
  int world = 0;                      // the world size that saved it
  size_t tensors = 0;                 // parameters and buffers written
  uint64_t bytes = 0;                 // of tensor data
  std::vector<std::string> files;     // written into the output, in the order written
  std::vector<std::string> notes;     // what was left out or skipped, and why
  std::vector<std::string> warnings;  // what keeps the output from being a model folder
};

// Throws InvalidArgument naming the file or what is missing for a missing, incomplete or corrupt
// checkpoint, for an output that is not empty and for one that overlaps the checkpoint;
// SystemError for an I/O error on the output.
// Either way the output is as it was.
MergeWeightsResult mergeWeights(const MergeWeightsOptions& options);

// Bytes from "5GB", "500MB", "10GiB", "1.5GB" or a plain number of bytes: KB, MB, GB, TB are
// powers of 1000 (as transformers' max_shard_size), KiB, MiB, GiB, TiB of 1024; case ignored.
// Throws InvalidArgument for anything else or for less than one byte.
uint64_t parseByteSize(const std::string& text);

// The conversions, as LibTorch rounds: float -> bfloat16 and -> IEEE half, round to nearest even
// (NaN: 0x7fc0 and 0x7e00, as c10's scalar conversions).
uint16_t floatToBFloat16(float value);
uint16_t floatToHalf(float value);
float halfToFloat(uint16_t bits);

}  // namespace cxxlaunch::tensorfile
