#pragma once
// A Hugging Face tokenizer.json run as the tokenizers library runs it, for the byte-level BPE
// files of Llama 3.x, Qwen2/2.5/3 and the SentencePiece-style BPE files of Mistral/Llama 2
// (Prepend/Replace or Metaspace):
//
//   added tokens split off -> normalizer -> pre-tokenizer -> BPE model -> post-processor
//
// and back through the decoder. Each stage is a component built from the file by its "type"
// (text/normalizer.h, pre_tokenizer.h, bpe.h, added_vocabulary.h, post_processor.h, decoder.h);
// a type outside these is an InvalidArgument that names it. Unicode classes come from PCRE2 and
// normalization from ICU (docs/text.md).
//
//   auto tok = cxxlaunch::text::Tokenizer::fromFolder("/models/Qwen2.5-0.5B");
//   std::vector<int32_t> ids = tok.encode("Hello world", /*add_special_tokens=*/true);
//   std::string text = tok.decode(ids, /*skip_special_tokens=*/true);
//
// No LibTorch. Thread-safety: a Tokenizer is immutable after construction apart from its word
// cache, which is locked; encode and decode may run on one Tokenizer from many threads. Copies
// share the loaded tables.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cxxlaunch::text {

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json (bos/eos/pad tokens,
  // add_bos_token/add_eos_token for the Llama tokenizer classes, clean_up_tokenization_spaces).
  // Throws InvalidArgument for a missing or malformed file and for an unsupported model type or
  // component, naming the file and the component.
  static Tokenizer fromFolder(const std::string& dir);

  // The same from the files' contents; `source` names the tokenizer.json in messages.
  // `tokenizer_config_json` may be empty (no tokenizer_config.json).
  static Tokenizer fromJson(std::string_view tokenizer_json, std::string_view tokenizer_config_json,
                            const std::string& source = "tokenizer.json");

  // The ids of `text` (well-formed UTF-8, else InvalidArgument). Special tokens written in the
  // text are always recognised; add_special_tokens adds what the post-processor adds (BOS/EOS).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;

  // The text of `ids`; an id outside [0, vocabSize()) with no token is an InvalidArgument.
  // skip_special_tokens leaves out the added tokens marked special. As transformers' decode:
  // with clean_up_tokenization_spaces in the config, " ." becomes "." and so on.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  // 1 + the largest id of the vocabulary and the added tokens: the embedding rows a model needs.
  int64_t vocabSize() const;

  // The special tokens named in tokenizer_config.json, when they are in the vocabulary.
  std::optional<int32_t> bosId() const;
  std::optional<int32_t> eosId() const;
  std::optional<int32_t> padId() const;

  // A token's id (added tokens included), or its text; nullopt when there is none.
  std::optional<int32_t> tokenToId(std::string_view token) const;
  std::optional<std::string> idToToken(int32_t id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace cxxlaunch::text
