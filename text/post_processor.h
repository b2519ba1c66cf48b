#pragma once
// Post-processors of tokenizer.json ("post_processor"), built by "type": TemplateProcessing (the
// single-sequence template: special tokens around $A, e.g. Llama 3's <|begin_of_text|>),
// ByteLevel (nothing to add to ids) and Sequence. They add special tokens only when
// add_special_tokens is true, as the library does. Immutable once built; thread-safe.

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace cxxlaunch::text {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Rewrites the ids of one encoded sequence; called only with add_special_tokens true.
  virtual void process(std::vector<int32_t>& ids) const = 0;
};

// Throws InvalidArgument naming an unsupported type or a bad field; `where` prefixes it.
std::unique_ptr<PostProcessor> makePostProcessor(const nlohmann::json& spec,
                                                 const std::string& where);

// A template of ids before and after the sequence, e.g. transformers' LlamaTokenizerFast builds
// one from add_bos_token/add_eos_token.
std::unique_ptr<PostProcessor> makeAroundTemplate(std::vector<int32_t> before,
                                                  std::vector<int32_t> after);

}  // namespace cxxlaunch::text
