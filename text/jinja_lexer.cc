#include "text/jinja_lexer.h"

#include <cstring>

#include "common/error.h"
#include "text/jinja_builtins.h"
#include "text/unicode.h"

namespace cxxlaunch::text::jinja {

void throwAt(int line, const std::string& what) {
  throw InvalidArgument("chat_template line " + std::to_string(line) + ": " + what);
}

namespace {

bool isSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Whitespace control strips what Python's re `\s` matches: Unicode whitespace, not only ASCII.
size_t spaceAt(const std::string& s, size_t i, size_t end) {
  if (isSpace(s[i])) return 1;
  if (static_cast<unsigned char>(s[i]) < 0x80) return 0;
  size_t next = i;
  const char32_t c = nextCodePoint(s, next);
  return next <= end && isPySpace(c) ? next - i : 0;
}

size_t spaceBefore(const std::string& s, size_t end) {
  if (end == 0) return 0;
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return spaceAt(s, start, end) == end - start ? end - start : 0;
}
bool isNameStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool isNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Jinja2 reads the template with its newlines made "\n" and, without keep_trailing_newline, one
// trailing newline dropped.
std::string normalizeNewlines(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      out += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      out += source[k];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Lexer {
 public:
  Lexer(const std::string& source, const LexOptions& options)
      : src_(normalizeNewlines(source)), options_(options) {}

  std::vector<Token> run() {
    bool strip_next = false;  // after a "-}}", "-%}" or "-#}"
    while (pos_ < src_.size()) {
      size_t tag = src_.find('{', pos_);
      while (tag != std::string::npos && tag + 1 < src_.size() &&
             std::strchr("{%#", src_[tag + 1]) == nullptr) {
        tag = src_.find('{', tag + 1);
      }
      if (tag != std::string::npos && tag + 1 >= src_.size()) tag = std::string::npos;
      size_t start = pos_;
      const size_t end = tag == std::string::npos ? src_.size() : tag;
      if (strip_next) {
        while (start < end) {
          const size_t n = spaceAt(src_, start, end);
          if (n == 0) break;
          start += n;
        }
      }
      std::string text = src_.substr(start, end - start);
      countLines(pos_, start);
      const int text_line = line_;
      countLines(start, end);
      if (tag != std::string::npos) {
        const char kind = src_[tag + 1];
        const char mark = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
        if (mark == '-') {
          while (const size_t n = spaceBefore(text, text.size())) text.resize(text.size() - n);
        } else if (mark != '+' && options_.lstrip_blocks && kind != '{') {
          const size_t nl = text.rfind('\n');
          const size_t from = nl == std::string::npos ? 0 : nl + 1;
          const bool line_start = nl != std::string::npos || start == 0 || src_[start - 1] == '\n';
          size_t blank = from;
          while (blank < text.size()) {
            const size_t n = spaceAt(text, blank, text.size());
            if (n == 0) break;
            blank += n;
          }
          if (line_start && blank == text.size()) {
            text.erase(from);
          }
        }
      }
      if (!text.empty()) tokens_.push_back({Token::Type::kText, text, text_line});
      if (tag == std::string::npos) break;
      pos_ = tag + 2;
      const char kind = src_[tag + 1];
      if (pos_ < src_.size() && (src_[pos_] == '-' || src_[pos_] == '+')) ++pos_;
      if (kind == '#') {
        const size_t close = src_.find("#}", pos_);
        if (close == std::string::npos) throwAt(line_, "the comment is never closed with '#}'");
        strip_next = close > pos_ && src_[close - 1] == '-';
        countLines(pos_, close);
        pos_ = close + 2;
        if (!strip_next && options_.trim_blocks && pos_ < src_.size() && src_[pos_] == '\n') {
          ++pos_;
          ++line_;
        }
        continue;
      }
      strip_next = insideTag(kind == '{');
    }
    tokens_.push_back({Token::Type::kEnd, "", line_});
    return std::move(tokens_);
  }

 private:
  void advance(size_t& k) {
    if (src_[k] == '\n') ++line_;
    ++k;
  }
  void countLines(size_t from, size_t to) {
    for (size_t k = from; k < to; ++k) line_ += src_[k] == '\n';
  }

  // Tokens up to the tag's close; returns whether it was a "-" close.
  bool insideTag(bool expression) {
    const int open_line = line_;
    tokens_.push_back(
        {expression ? Token::Type::kExprOpen : Token::Type::kStmtOpen, "", open_line});
    int depth = 0;  // brackets open inside the tag, so "}}" of a dict literal does not close it
    const char closer = expression ? '}' : '%';
    while (true) {
      while (pos_ < src_.size() && isSpace(src_[pos_])) advance(pos_);
      if (pos_ >= src_.size()) {
        throwAt(open_line, std::string("the tag is never closed with '") + closer + "}'");
      }
      const char c = src_[pos_];
      if (depth == 0) {
        size_t close = std::string::npos;
        bool strip = false;
        if ((c == '-' || c == '+') &&
            src_.compare(pos_ + 1, 2, std::string(1, closer) + "}") == 0) {
          close = pos_ + 3;
          strip = c == '-';
        } else if (c == closer && pos_ + 1 < src_.size() && src_[pos_ + 1] == '}') {
          close = pos_ + 2;
        }
        if (close != std::string::npos) {
          pos_ = close;
          tokens_.push_back(
              {expression ? Token::Type::kExprClose : Token::Type::kStmtClose, "", line_});
          if (!expression && !strip && c != '+' && options_.trim_blocks && pos_ < src_.size() &&
              src_[pos_] == '\n') {
            ++pos_;
            ++line_;
          }
          return strip;
        }
      }
      if (c == '\'' || c == '"') {
        tokens_.push_back({Token::Type::kString, readString(c), line_});
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        readNumber();
      } else if (isNameStart(c)) {
        const size_t start = pos_;
        while (pos_ < src_.size() && isNameChar(src_[pos_])) ++pos_;
        tokens_.push_back({Token::Type::kName, src_.substr(start, pos_ - start), line_});
      } else {
        static const char* kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* two : kTwo) {
          if (src_.compare(pos_, 2, two) == 0) op = two;
        }
        if (op.empty()) {
          if (std::strchr("+-*/%~<>=.,:|()[]{}", c) == nullptr) {
            throwAt(line_, std::string("unexpected character '") + c + "' in a tag");
          }
          op = std::string(1, c);
          if (c == '(' || c == '[' || c == '{') ++depth;
          if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
        }
        pos_ += op.size();
        tokens_.push_back({Token::Type::kOp, op, line_});
      }
    }
  }

  // A Python string literal's text: \n, \t, \r, \\, \', \", \xHH, \uHHHH, \UHHHHHHHH and the
  // rest of Python's escapes; an unknown escape keeps its backslash, as Python does.
  std::string readString(char quote) {
    const int start_line = line_;
    ++pos_;
    std::string out;
    while (true) {
      if (pos_ >= src_.size()) throwAt(start_line, "a string is never closed");
      const char c = src_[pos_];
      if (c == quote) {
        ++pos_;
        return out;
      }
      if (c != '\\' || pos_ + 1 >= src_.size()) {
        advance(pos_);
        out += c;
        continue;
      }
      const char e = src_[pos_ + 1];
      pos_ += 2;
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case '0':
          out += '\0';
          break;
        case '\n':
          ++line_;
          break;
        case 'x':
        case 'u':
        case 'U': {
          const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          char32_t cp = 0;
          for (int k = 0; k < digits; ++k) {
            const int h = pos_ < src_.size() ? hexValue(src_[pos_]) : -1;
            if (h < 0) throwAt(line_, std::string("a malformed \\") + e + " escape in a string");
            cp = cp * 16 + static_cast<char32_t>(h);
            ++pos_;
          }
          appendUtf8(out, cp);
          break;
        }
        default:
          out += '\\';
          out += e;
      }
    }
  }

  void readNumber() {
    const size_t start = pos_;
    bool real = false;
    auto digits = [&] {
      while (pos_ < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_'))
        ++pos_;
    };
    digits();
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      real = true;
      ++pos_;
      digits();
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t k = pos_ + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k]))) {
        real = true;
        pos_ = k;
        digits();
      }
    }
    std::string text;
    for (size_t k = start; k < pos_; ++k) {
      if (src_[k] != '_') text += src_[k];
    }
    tokens_.push_back({real ? Token::Type::kFloat : Token::Type::kInt, text, line_});
  }

  std::string src_;
  LexOptions options_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex(const std::string& source, const LexOptions& options) {
  return Lexer(source, options).run();
}

}  // namespace cxxlaunch::text::jinja
