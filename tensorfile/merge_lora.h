#pragma once
// `cxxlaunch merge-weights --lora ADAPTER --base MODEL OUTPUT`: a LoRA adapter in PEFT's layout
// (adapter_config.json and adapter_model.safetensors, as PEFT's save_pretrained and `finetune`
// write them) merged into its base model folder, written as a Hugging Face model folder again:
// each adapted Linear's weight becomes W' = W + scale * B A (scale lora_alpha / r, or
// lora_alpha / sqrt(r) with use_rslora), every other tensor is copied byte for byte, and the
// names, dtypes and shapes are the base's. No LibTorch: the launcher links it.
//
// Arithmetic: the products of B A are exact in double precision and summed in it; W + scale * B A
// is formed in double and rounded once to W's dtype (F32, BF16 or F16; to nearest even), so the
// merged weight is the base's dtype's nearest value to the exact sum (up to double's rounding).
// Streamed: a block of W's rows at a time, the rows shared among threads; memory holds A, B and
// a few blocks, whatever the model.
//
// The files: by default the base's own (the same file names, each with the same tensors in the
// same order, and its index); with max_file_bytes, split afresh as merge_weights.h writes. The
// base folder's config.json and tokenizer files (model_folder.h) are copied beside them. OUTPUT
// is written as merge_weights.h writes it (staging folder, rename, leftovers: merge_output.h) and
// may not overlap the adapter or the base.
//
// Thread-safety: none; one call at a time per output.

#include <cstdint>
#include <string>
#include <vector>

namespace cxxlaunch::tensorfile {

struct MergeLoraOptions {
  std::string adapter;     // the folder with adapter_config.json and adapter_model.safetensors
  std::string base;        // the base model folder (model.safetensors, or an index and its files)
  std::string output;      // the folder to write; refused when it exists and is not empty ...
  bool overwrite = false;  // ... unless this is set
  uint64_t max_file_bytes = 0;  // of tensor data per file; 0: the base's files as they are
  int threads = 0;              // for the products; 0: the machine's cores (at most 16)
};

struct MergeLoraResult {
  size_t tensors = 0;                 // written
  size_t merged = 0;                  // of them, with an adapter merged in
  int rank = 0;                       // the adapter's r
  double scale = 0;                   // lora_alpha / r, or / sqrt(r)
  uint64_t bytes = 0;                 // of tensor data
  std::vector<std::string> files;     // written into the output, in the order written
  std::vector<std::string> notes;     // leftovers removed
  std::vector<std::string> warnings;  // what keeps the output from being a model folder
};

// Everything is checked before anything is written. Throws InvalidArgument for: a missing or
// malformed adapter_config.json, an adapter that is not LORA, a configuration merging does not
// support (fan_in_fan_out, a bias other than "none", modules_to_save, DoRA, rank_pattern or
// alpha_pattern), adapter tensors that are not a lora_A/lora_B pair of a Linear, a target the
// base lacks (named), shapes that do not match (named: base [out, in], A [r, in], B [out, r]), an
// r other than A's rows, a missing or corrupt safetensors file, an OUTPUT that is not empty
// without `overwrite` or that overlaps the inputs; SystemError for an I/O error on the output.
// Either way the output is as it was.
MergeLoraResult mergeLora(const MergeLoraOptions& options);

// `value` rounded to float32 to odd: exactly when it is a float, else the neighbour of the two
// around it whose last bit is 1. Rounding that to a format with at least two fewer bits (BF16,
// F16) to nearest even rounds `value` once.
float roundToOddFloat(double value);

}  // namespace cxxlaunch::tensorfile
