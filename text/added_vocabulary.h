#pragma once
// The added tokens of tokenizer.json ("added_tokens": special ones such as <|im_start|> and
// others), found in the text before the model sees it, as the tokenizers library's
// AddedVocabulary does: leftmost match first, the longest of those that start there; tokens with
// `normalized: false` in the raw text, those with `normalized: true` in each normalized piece
// between them. `single_word` keeps a match only when no word character touches it; `lstrip` and
// `rstrip` take the whitespace beside it into the token. Immutable once built; thread-safe.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cxxlaunch::text {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool normalized = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

// A stretch of text: an added token's id, or -1 for text that goes on through the pipeline.
struct Segment {
  size_t begin;
  size_t end;
  int32_t id;
};

class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  // `normalize` turns the content of a `normalized: true` token into what it is matched as.
  AddedVocabulary(std::vector<AddedToken> tokens,
                  const std::function<void(std::string&)>& normalize);

  // Splits `text` at the tokens of one set: `normalized` false for the raw text, true for a
  // piece after the normalizer. An empty text is one empty text segment.
  std::vector<Segment> split(std::string_view text, bool normalized) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // A byte trie over the tokens of one set, for leftmost-longest matching.
  struct Trie {
    struct Node {
      std::unordered_map<unsigned char, int32_t> children;
      int32_t token = -1;  // index into tokens_ when a token ends here
    };
    std::vector<Node> nodes{Node{}};
    bool first_byte[256] = {};
    void insert(std::string_view content, int32_t token);
    // The longest token starting at text[at]: its index and end, or -1.
    int32_t longestAt(std::string_view text, size_t at, size_t& end) const;
  };

  std::vector<AddedToken> tokens_;
  Trie raw_;
  Trie normalized_;
};

}  // namespace cxxlaunch::text
