#pragma once
// Pre-tokenizers of tokenizer.json, built from the "pre_tokenizer" object by its "type":
//   - Split: a literal or the file's own regular expression (text/regex.h), with the behaviors
//     Removed, Isolated, MergedWithPrevious, MergedWithNext and Contiguous, and `invert`;
//   - ByteLevel: `add_prefix_space`, `use_regex` (GPT-2's regex first), then every byte of a
//     piece as GPT-2's printable character (text/unicode.h);
//   - Metaspace (SentencePiece-style files): spaces become `replacement` ("▁"), which
//     `prepend_scheme` puts first ("always", "first": only where the text begins, "never"),
//     and `split` splits before each one;
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
  // Replaces each piece of `pieces` by the pieces it splits into, in order. `first_at_start`:
  // pieces[0] begins where the text given to encode() begins (Metaspace's "first" reads it); a
  // step that removes the beginning clears it.
  virtual void preTokenize(std::vector<std::string>& pieces, bool& first_at_start) const = 0;
};

// Throws InvalidArgument naming an unsupported type or a bad field; `where` prefixes it.
std::unique_ptr<PreTokenizer> makePreTokenizer(const nlohmann::json& spec,
                                               const std::string& where);

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// The pieces `text` splits into, given its `matches` (sorted, non-overlapping byte ranges): what
// the tokenizers library's NormalizedString::split does with one behavior. Exposed for its test.
// `starts_at_zero`, when given, tells whether the first piece begins at text[0].
std::vector<std::string> splitByMatches(const std::string& text,
                                        const std::vector<std::pair<size_t, size_t>>& matches,
                                        SplitBehavior behavior, bool invert,
                                        bool* starts_at_zero = nullptr);

}  // namespace cxxlaunch::text
