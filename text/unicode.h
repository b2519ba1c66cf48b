#pragma once
// The Unicode pieces the tokenizer pipeline shares: GPT-2's byte <-> character table, UTF-8
// stepping, lossy UTF-8 decoding as Rust's String::from_utf8_lossy does it, the character
// classes of Rust's `char` that added tokens use, and normalization forms through ICU. Character
// properties and normalization come from ICU, never from tables of our own. Thread-safe.

#include <cstdint>
#include <string>
#include <string_view>

namespace cxxlaunch::text {

// GPT-2's bytes_to_unicode: bytes 33-126, 161-172 and 174-255 map to themselves, the other 68 to
// U+0100, U+0101, ... in byte order. Returns the character's UTF-8.
const std::string& byteToUnicode(uint8_t byte);

// The byte that `c` stands for in that table, or -1 when `c` is not in it.
int unicodeToByte(char32_t c);

// The code point at text[i] (well-formed UTF-8 assumed), advancing i past it.
char32_t nextCodePoint(std::string_view text, size_t& i);

// The number of bytes of the UTF-8 sequence whose first byte is `lead` (1 for a stray byte).
size_t utf8Length(uint8_t lead);

void appendUtf8(std::string& out, char32_t c);

// `bytes` as UTF-8 with each maximal ill-formed subsequence replaced by U+FFFD (Unicode's
// recommended practice, as Rust's from_utf8_lossy and Python's "replace" handler do).
std::string utf8Lossy(std::string_view bytes);

// `\s` and `\w` of Rust's regex crate, which added tokens' lstrip/rstrip and single_word use:
// the White_Space property, and UTS #18's word characters (Alphabetic, marks, decimal digits,
// connector punctuation such as '_', Join_Control).
bool isWhitespace(char32_t c);
bool isWordCharacter(char32_t c);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };

// `text` (well-formed UTF-8) in normal form `form`, through ICU's Normalizer2; text that is
// already normalized comes back unchanged without a copy of the work.
void normalizeInPlace(std::string& text, NormalForm form);

}  // namespace cxxlaunch::text
