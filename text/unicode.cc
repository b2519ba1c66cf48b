#include "text/unicode.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>

#include <algorithm>
#include <array>

#include "common/error.h"

namespace cxxlaunch::text {
namespace {

struct ByteTable {
  std::array<std::string, 256> to_unicode;
  std::array<int16_t, 512> to_byte;  // the table's characters are all below U+0200
  ByteTable() {
    to_byte.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      const char32_t c = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(next++);
      appendUtf8(to_unicode[b], c);
      to_byte[c] = static_cast<int16_t>(b);
    }
  }
};

const ByteTable& byteTable() {
  static const ByteTable table;
  return table;
}

// The length of the well-formed prefix of the sequence at text[i] and whether it is complete:
// Unicode's table 3-7 of well-formed byte sequences.
size_t wellFormedPrefix(std::string_view text, size_t i, bool& complete) {
  auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t b0 = byte(i);
  complete = false;
  size_t length = 0;
  uint8_t low = 0x80, high = 0xBF;
  if (b0 < 0x80) {
    complete = true;
    return 1;
  } else if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3;
    if (b0 == 0xE0) low = 0xA0;
    if (b0 == 0xED) high = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4;
    if (b0 == 0xF0) low = 0x90;
    if (b0 == 0xF4) high = 0x8F;
  } else {
    return 1;  // never starts a sequence: a subpart of its own
  }
  size_t k = 1;
  for (; k < length && i + k < text.size(); ++k) {
    const uint8_t b = byte(i + k);
    const uint8_t lo = k == 1 ? low : 0x80, hi = k == 1 ? high : 0xBF;
    if (b < lo || b > hi) break;
  }
  complete = k == length;
  return k;
}

}  // namespace

const std::string& byteToUnicode(uint8_t byte) { return byteTable().to_unicode[byte]; }

int unicodeToByte(char32_t c) { return c < 512 ? byteTable().to_byte[c] : -1; }

size_t utf8Length(uint8_t lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

char32_t nextCodePoint(std::string_view text, size_t& i) {
  const auto b0 = static_cast<uint8_t>(text[i]);
  const size_t n = std::min(utf8Length(b0), text.size() - i);
  char32_t c = n == 1 ? b0 : b0 & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) c = (c << 6) | (static_cast<uint8_t>(text[i + k]) & 0x3F);
  i += n;
  return c;
}

void appendUtf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

std::string utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    bool complete = false;
    const size_t n = wellFormedPrefix(bytes, i, complete);
    if (complete) {
      out.append(bytes.substr(i, n));
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += n;
  }
  return out;
}

bool isWhitespace(char32_t c) { return u_isUWhiteSpace(static_cast<UChar32>(c)); }

bool isWordCharacter(char32_t c) {
  const auto cp = static_cast<UChar32>(c);
  if (u_isUAlphabetic(cp) || u_hasBinaryProperty(cp, UCHAR_JOIN_CONTROL)) return true;
  const int8_t type = u_charType(cp);
  return type == U_NON_SPACING_MARK || type == U_COMBINING_SPACING_MARK ||
         type == U_ENCLOSING_MARK || type == U_DECIMAL_DIGIT_NUMBER ||
         type == U_CONNECTOR_PUNCTUATION;
}

void normalizeInPlace(std::string& text, NormalForm form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = nullptr;
  switch (form) {
    case NormalForm::kNfc:
      normalizer = icu::Normalizer2::getNFCInstance(status);
      break;
    case NormalForm::kNfd:
      normalizer = icu::Normalizer2::getNFDInstance(status);
      break;
    case NormalForm::kNfkc:
      normalizer = icu::Normalizer2::getNFKCInstance(status);
      break;
    case NormalForm::kNfkd:
      normalizer = icu::Normalizer2::getNFKDInstance(status);
      break;
  }
  if (U_FAILURE(status)) {
    throw Error(std::string("ICU could not load its normalization data: ") + u_errorName(status));
  }
  const icu::StringPiece piece(text.data(), static_cast<int32_t>(text.size()));
  if (normalizer->isNormalizedUTF8(piece, status) && U_SUCCESS(status)) return;
  status = U_ZERO_ERROR;
  std::string out;
  out.reserve(text.size());
  icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(text.size()));
  normalizer->normalizeUTF8(0, piece, sink, nullptr, status);
  if (U_FAILURE(status)) {
    throw Error(std::string("ICU normalization failed: ") + u_errorName(status));
  }
  text.swap(out);
}

}  // namespace cxxlaunch::text
