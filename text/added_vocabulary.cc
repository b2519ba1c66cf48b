#include "text/added_vocabulary.h"

#include "text/unicode.h"

namespace cxxlaunch::text {
namespace {

// The last character of `text`, or 0 for an empty one.
char32_t lastCodePoint(std::string_view text) {
  if (text.empty()) return 0;
  size_t start = text.size() - 1;
  while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
  return nextCodePoint(text, start);
}

}  // namespace

void AddedVocabulary::Trie::insert(std::string_view content, int32_t token) {
  if (content.empty()) return;
  first_byte[static_cast<unsigned char>(content[0])] = true;
  int32_t node = 0;
  for (const char c : content) {
    const auto byte = static_cast<unsigned char>(c);
    const auto found = nodes[node].children.find(byte);
    if (found != nodes[node].children.end()) {
      node = found->second;
    } else {
      nodes.emplace_back();
      const auto child = static_cast<int32_t>(nodes.size() - 1);
      nodes[node].children.emplace(byte, child);
      node = child;
    }
  }
  // Two tokens of the same content: the first one listed wins, as the library's map keeps it.
  if (nodes[node].token < 0) nodes[node].token = token;
}

int32_t AddedVocabulary::Trie::longestAt(std::string_view text, size_t at, size_t& end) const {
  int32_t best = -1;
  int32_t node = 0;
  for (size_t i = at; i < text.size(); ++i) {
    const auto found = nodes[node].children.find(static_cast<unsigned char>(text[i]));
    if (found == nodes[node].children.end()) break;
    node = found->second;
    if (nodes[node].token >= 0) {
      best = nodes[node].token;
      end = i + 1;
    }
  }
  return best;
}

AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens,
                                 const std::function<void(std::string&)>& normalize)
    : tokens_(std::move(tokens)) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const auto index = static_cast<int32_t>(i);
    if (tokens_[i].normalized) {
      std::string content = tokens_[i].content;
      if (normalize) normalize(content);
      normalized_.insert(content, index);
    } else {
      raw_.insert(tokens_[i].content, index);
    }
  }
}

std::vector<Segment> AddedVocabulary::split(std::string_view text, bool normalized) const {
  const Trie& trie = normalized ? normalized_ : raw_;
  std::vector<Segment> segments;
  if (text.empty()) {
    segments.push_back({0, 0, -1});
    return segments;
  }
  size_t done = 0;  // the end of the last token taken
  for (size_t at = 0; at < text.size();) {
    size_t end = 0;
    const int32_t index =
        trie.first_byte[static_cast<unsigned char>(text[at])] ? trie.longestAt(text, at, end) : -1;
    if (index < 0) {
      ++at;
      continue;
    }
    const AddedToken& token = tokens_[index];
    size_t begin = at;
    if (token.single_word) {
      const bool space_before =
          begin == 0 || !isWordCharacter(lastCodePoint(text.substr(0, begin)));
      size_t after = end;
      const bool space_after = end == text.size() || !isWordCharacter(nextCodePoint(text, after));
      if (!space_before || !space_after) {
        // Dropped, and its bytes are not searched again: the library's match iterator has
        // already moved past them.
        at = end;
        continue;
      }
    }
    if (token.lstrip) {
      while (begin > done) {
        const char32_t c = lastCodePoint(text.substr(0, begin));
        if (!isWhitespace(c)) break;
        size_t width = 1;
        while ((static_cast<uint8_t>(text[begin - width]) & 0xC0) == 0x80) ++width;
        begin -= width;
      }
    }
    if (token.rstrip) {
      while (end < text.size()) {
        size_t next = end;
        if (!isWhitespace(nextCodePoint(text, next))) break;
        end = next;
      }
    }
    if (begin > done) segments.push_back({done, begin, -1});
    segments.push_back({begin, end, token.id});
    done = end;
    at = end;
  }
  if (done < text.size()) segments.push_back({done, text.size(), -1});
  return segments;
}

}  // namespace cxxlaunch::text
