#pragma once
// What makes a folder of weights a Hugging Face model folder: the files beside the safetensors
// that `transformers` and `finetune` read. finetune's export copies them from its --model_dir, and
// `cxxlaunch merge-weights` from the folder the checkpoint's job loaded (manifest counter
// model_source), so that both outputs load as the folder they came from did.

namespace cxxlaunch::tensorfile {

// Copied when the source folder has them; config.json is the one a model folder needs.
inline constexpr const char* kModelFolderFiles[] = {
    "config.json",           "tokenizer.model",         "tokenizer.json",
    "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"};

// The most bytes such a file may have (a tokenizer.json of a 256k vocabulary is about 30 MB).
inline constexpr unsigned long kMaxModelFolderFileBytes = 512ul << 20;

}  // namespace cxxlaunch::tensorfile
