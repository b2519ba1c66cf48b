#pragma once
// The BPE model of tokenizer.json ("model": {"type": "BPE", ...}), as the tokenizers library's
// models/bpe runs it: a pre-token becomes its characters' ids (a character outside the vocabulary
// becomes its bytes' <0xNN> tokens with `byte_fallback`, or `unk_token`, fused with `fuse_unk`),
// then the adjacent pair of lowest merge rank is merged, leftmost first, until no pair has a
// merge. `ignore_merges` (Llama 3) emits a pre-token that is itself in the vocabulary as one id.
// `continuing_subword_prefix` and `end_of_word_suffix` are honoured; `dropout` is ignored (these
// files set none, and tokenizing training data must be deterministic).
//
// A word cache in front (10,000 words shorter than 256 bytes, as the library's) makes repeated
// words one lookup. Thread-safe: the cache is behind a reader-writer lock.

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cxxlaunch::text {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class Bpe {
 public:
  // Throws InvalidArgument for a merge whose parts or result are not in the vocabulary, or a bad
  // field; `where` prefixes the message.
  static std::unique_ptr<Bpe> fromJson(const nlohmann::json& model, const std::string& where);

  // Appends the ids of one pre-token.
  void tokenize(std::string_view word, std::vector<int32_t>& ids) const;

  const Vocab& vocab() const { return vocab_; }

 private:
  Bpe() = default;
  void mergeWord(std::string_view word, std::vector<int32_t>& symbols) const;

  Vocab vocab_;
  // (left id, right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<uint32_t, int32_t>> merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  std::array<int32_t, 256> byte_ids_{};  // <0xNN>'s id, or -1

  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace cxxlaunch::text
