#pragma once
// Pre-tokenizers of tokenizer.json, built from the "pre_tokenizer" object by its "type":
//   - Split: a literal or the file's own regular expression (text/regex.h), with the behaviors
//     Removed, Isolated, MergedWithPrevious, MergedWithNext and Contiguous, and `invert`;
//   - ByteLevel: `add_prefix_space`, `use_regex` (GPT-2's regex first), then every byte of a
//     piece as GPT-2's printable character (text/unicode.h);
//   - Sequence of these.
// A null pre-tokenizer leaves the text in one piece (makePreTokenizer returns nullptr). As in
// the tokenizers library, every piece is worked on by itself, and empty pieces are dropped.
// Immutable once built; thread-safe.

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace cxxlaunch::text {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces each piece of `pieces` by the pieces it splits into, in order.
  virtual void preTokenize(std::vector<std::string>& pieces) const = 0;
};

// Throws InvalidArgument naming an unsupported type or a bad field; `where` prefixes it.
std::unique_ptr<PreTokenizer> makePreTokenizer(const nlohmann::json& spec,
                                               const std::string& where);

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// The pieces `text` splits into, given its `matches` (sorted, non-overlapping byte ranges): what
// the tokenizers library's NormalizedString::split does with one behavior. Exposed for its test.
std::vector<std::string> splitByMatches(const std::string& text,
                                        const std::vector<std::pair<size_t, size_t>>& matches,
                                        SplitBehavior behavior, bool invert);

}  // namespace cxxlaunch::text
