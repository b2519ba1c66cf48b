#pragma once
// The regular expressions of tokenizer.json (Split patterns, Replace normalizers, GPT-2's
// pre-tokenizer regex), which the tokenizers library runs with Oniguruma, run here with PCRE2
// (UTF and Unicode properties on, JIT-compiled). Both are backtracking engines with leftmost-first
// alternation, and `\p{L}`, `\p{N}`, `(?i:...)` and lookahead mean the same in both. `\s` and
// `\S` outside a character class and `\s` inside one are rewritten to Oniguruma's set (the
// White_Space property), because PCRE2's also has U+180E (its \h keeps that former space).
//
// A Regex is immutable after construction; findAll() may be called from any number of threads.

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cxxlaunch::text {

class Regex {
 public:
  // Throws InvalidArgument naming `pattern` and PCRE2's reason when it does not compile.
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the byte ranges [begin, end) of the non-overlapping matches in `text` (well-formed
  // UTF-8), scanning left to right; an empty match moves the scan on by one character.
  void findAll(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8: the header stays free of pcre2.h
};

// A literal string's occurrences, non-overlapping, left to right (Split's {"String": ...}).
void findAllLiteral(std::string_view text, std::string_view literal,
                    std::vector<std::pair<size_t, size_t>>& out);

// The pattern with Oniguruma's `\s` spelled out for PCRE2 (see above); exposed for its test.
std::string translateOnigurumaPattern(std::string_view pattern);

}  // namespace cxxlaunch::text
