#include "text/decoder.h"

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "text/json_fields.h"
#include "text/unicode.h"

namespace cxxlaunch::text {
namespace {

class ByteLevel final : public Decoder {
 public:
  void decodeChain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& token : tokens) {
      // A token with a character outside the table (an added token) stays as it is written.
      const size_t start = bytes.size();
      bool mapped = true;
      for (size_t i = 0; i < token.size() && mapped;) {
        const int b = unicodeToByte(nextCodePoint(token, i));
        if (b < 0) {
          mapped = false;
        } else {
          bytes += static_cast<char>(b);
        }
      }
      if (!mapped) {
        bytes.resize(start);
        bytes += token;
      }
    }
    tokens.assign(1, utf8Lossy(bytes));
  }
};

class Replace final : public Decoder {
 public:
  Replace(std::string pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decodeChain(std::vector<std::string>& tokens) const override {
    if (pattern_.empty()) return;
    for (auto& token : tokens) {
      std::string out;
      size_t last = 0;
      for (size_t at = token.find(pattern_); at != std::string::npos;
           at = token.find(pattern_, last)) {
        out.append(token, last, at - last);
        out += content_;
        last = at + pattern_.size();
      }
      out.append(token, last, std::string::npos);
      token.swap(out);
    }
  }

 private:
  std::string pattern_;
  std::string content_;
};

class ByteFallback final : public Decoder {
 public:
  void decodeChain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (isValidUtf8Bytes(pending)) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
    };
    for (auto& token : tokens) {
      int byte = -1;
      if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>') {
        byte = hexByte(token[3], token[4]);
      }
      if (byte >= 0) {
        pending += static_cast<char>(byte);
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    tokens.swap(out);
  }

 private:
  static int hexDigit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static int hexByte(char high, char low) {
    const int h = hexDigit(high), l = hexDigit(low);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
  }
  static bool isValidUtf8Bytes(const std::string& bytes) { return utf8Lossy(bytes) == bytes; }
};

class Fuse final : public Decoder {
 public:
  void decodeChain(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const auto& token : tokens) joined += token;
    tokens.assign(1, joined);
  }
};

// Strip: up to `start` leading and `stop` trailing copies of one character from each token.
class Strip final : public Decoder {
 public:
  Strip(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void decodeChain(std::vector<std::string>& tokens) const override {
    for (auto& token : tokens) {
      std::vector<std::pair<size_t, char32_t>> chars;  // byte offset, character
      for (size_t i = 0; i < token.size();) {
        const size_t at = i;
        chars.emplace_back(at, nextCodePoint(token, i));
      }
      size_t start_cut = 0;
      for (size_t k = 0; k < start_ && k < chars.size() && chars[k].second == content_; ++k) {
        start_cut = k + 1;
      }
      size_t stop_cut = chars.size();
      for (size_t k = 0;
           k < stop_ && k < chars.size() && chars[chars.size() - 1 - k].second == content_; ++k) {
        stop_cut = chars.size() - 1 - k;
      }
      if (start_cut >= stop_cut) {
        token.clear();
        continue;
      }
      const size_t begin = chars[start_cut].first;
      const size_t end = stop_cut < chars.size() ? chars[stop_cut].first : token.size();
      token = token.substr(begin, end - begin);
    }
  }

 private:
  char32_t content_;
  size_t start_;
  size_t stop_;
};

// Metaspace: `replacement` back to spaces; in the first token it is dropped instead, unless the
// pre-tokenizer never prepends one.
class Metaspace final : public Decoder {
 public:
  Metaspace(char32_t replacement, bool drop_in_first)
      : replacement_(replacement), drop_in_first_(drop_in_first) {}
  void decodeChain(std::vector<std::string>& tokens) const override {
    for (size_t t = 0; t < tokens.size(); ++t) {
      std::string out;
      const std::string& token = tokens[t];
      for (size_t i = 0; i < token.size();) {
        const size_t start = i;
        if (nextCodePoint(token, i) != replacement_) {
          out.append(token, start, i - start);
        } else if (t != 0 || !drop_in_first_) {
          out += ' ';
        }
      }
      tokens[t].swap(out);
    }
  }

 private:
  char32_t replacement_;
  bool drop_in_first_;
};

class Sequence final : public Decoder {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void decodeChain(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) step->decodeChain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

}  // namespace

std::unique_ptr<Decoder> makeDecoder(const nlohmann::json& spec, const std::string& where) {
  if (spec.is_null()) return nullptr;
  const std::string type = typeOf(spec, where);
  if (type == "ByteLevel") return std::make_unique<ByteLevel>();
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Replace") {
    bool is_regex = false;
    std::string pattern = patternField(spec, is_regex, where);
    if (is_regex) {
      throw InvalidArgument(where +
                            ": a Replace decoder with a Regex pattern is not supported "
                            "(supported: a String pattern)");
    }
    return std::make_unique<Replace>(std::move(pattern), stringField(spec, "content", where));
  }
  if (type == "Strip") {
    const std::string content = stringField(spec, "content", where);
    size_t i = 0;
    const char32_t c = content.empty() ? U' ' : nextCodePoint(content, i);
    const int64_t start = intField(spec, "start", 0, where),
                  stop = intField(spec, "stop", 0, where);
    if (start < 0 || stop < 0)
      throw InvalidArgument(where + ": Strip's start and stop must be >= 0");
    return std::make_unique<Strip>(c, static_cast<size_t>(start), static_cast<size_t>(stop));
  }
  if (type == "Metaspace") {
    const std::string replacement = stringField(spec, "replacement", where);
    if (replacement.empty()) throw InvalidArgument(where + ": Metaspace's replacement is empty");
    size_t i = 0;
    const char32_t c = nextCodePoint(replacement, i);
    bool prepends = boolField(spec, "add_prefix_space", true, where);
    if (spec.contains("prepend_scheme") && spec["prepend_scheme"].is_string()) {
      prepends = spec["prepend_scheme"].get<std::string>() != "never";
    }
    return std::make_unique<Metaspace>(c, prepends);
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> steps;
    for (const auto& step : arrayField(spec, "decoders", where)) {
      auto made = makeDecoder(step, where);
      if (made) steps.push_back(std::move(made));
    }
    return std::make_unique<Sequence>(std::move(steps));
  }
  throwUnsupported(where, type,
                   {"ByteLevel", "ByteFallback", "Fuse", "Replace", "Strip", "Sequence"});
}

}  // namespace cxxlaunch::text
