#pragma once
// A LoRA adapter in PEFT's layout, read and checked without LibTorch for `merge-weights --lora`
// (merge_lora.h): adapter_config.json's settings and adapter_model.safetensors' lora_A/lora_B
// pairs, keyed by the base tensor each one adapts. Internal to merge_lora.cc.
//
// PEFT's key names: `base_model.model.<module>.lora_A.weight` ([r, in]) and `...lora_B.weight`
// ([out, r]) adapt the base tensor `<module>.weight` ([out, in]); older PEFT wrote the adapter's
// name too (`<module>.lora_A.default.weight`), which is accepted when every key has the same one.
//
// Thread-safety: none needed (plain data, free functions).

#include <map>
#include <string>

#include "tensorfile/safetensors_folder.h"

namespace cxxlaunch::tensorfile {

inline constexpr char kAdapterConfigName[] = "adapter_config.json";
inline constexpr char kAdapterWeightsName[] = "adapter_model.safetensors";

struct LoraPair {
  std::string a, b;  // the adapter's tensor names
};

struct LoraAdapter {
  int r = 8;  // PEFT's defaults where the config leaves them out
  double alpha = 8;
  bool rslora = false;
  double scale = 1;                       // alpha / r, or alpha / sqrt(r) with rslora
  std::string base_model;                 // base_model_name_or_path, for messages; may be empty
  std::map<std::string, LoraPair> pairs;  // base tensor name -> its lora_A and lora_B
};

// Reads `dir`/adapter_config.json. Throws InvalidArgument for one that is missing or malformed,
// an adapter that is not LORA, and a setting merging does not support (fan_in_fan_out, a bias
// other than "none", modules_to_save, use_dora, rank_pattern, alpha_pattern).
LoraAdapter readLoraConfig(const std::string& dir);

// Fills adapter.pairs from the tensors of `weights` (the adapter_model.safetensors at
// `weights_path`). Throws InvalidArgument for a tensor that is no lora_A/lora_B of a module, keys
// of several adapters, and an A without its B or a B without its A.
void pairLoraTensors(LoraAdapter& adapter, const SafetensorsFolder& weights,
                     const std::string& weights_path);

// Checks the pairs against the base model's tensors: each target is there (the missing ones
// named), floating-point and 2-D [out, in]; A is [r, in] with r the config's, B [out, r]; A and B
// are floating-point. Throws InvalidArgument naming what does not match.
void checkLoraAgainstBase(const LoraAdapter& adapter, const SafetensorsFolder& weights,
                          const SafetensorsFolder& base, const std::string& base_path);

}  // namespace cxxlaunch::tensorfile
