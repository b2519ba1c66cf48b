#include "text/normalizer.h"

#include <nlohmann/json.hpp>
#include <vector>

#include "common/error.h"
#include "text/json_fields.h"
#include "text/regex.h"
#include "text/unicode.h"

namespace cxxlaunch::text {
namespace {

class UnicodeForm final : public Normalizer {
 public:
  explicit UnicodeForm(NormalForm form) : form_(form) {}
  void normalize(std::string& text) const override { normalizeInPlace(text, form_); }

 private:
  NormalForm form_;
};

// Prepend: `prepend` before a non-empty text (SentencePiece-style files put "▁" there).
class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

// Replace: every match of a literal or a regular expression becomes `content`.
class Replace final : public Normalizer {
 public:
  Replace(std::string pattern, bool is_regex, std::string content)
      : literal_(std::move(pattern)), content_(std::move(content)) {
    if (is_regex) regex_ = std::make_unique<Regex>(literal_);
  }
  void normalize(std::string& text) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    if (regex_) {
      regex_->findAll(text, matches);
    } else {
      findAllLiteral(text, literal_, matches);
    }
    if (matches.empty()) return;
    std::string out;
    out.reserve(text.size());
    size_t last = 0;
    for (const auto& [begin, end] : matches) {
      out.append(text, last, begin - last);
      out += content_;
      last = end;
    }
    out.append(text, last, std::string::npos);
    text.swap(out);
  }

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
  std::string content_;
};

class Sequence final : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void normalize(std::string& text) const override {
    for (const auto& step : steps_) step->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> makeNormalizer(const nlohmann::json& spec, const std::string& where) {
  if (spec.is_null()) return nullptr;
  const std::string type = typeOf(spec, where);
  if (type == "NFC") return std::make_unique<UnicodeForm>(NormalForm::kNfc);
  if (type == "NFD") return std::make_unique<UnicodeForm>(NormalForm::kNfd);
  if (type == "NFKC") return std::make_unique<UnicodeForm>(NormalForm::kNfkc);
  if (type == "NFKD") return std::make_unique<UnicodeForm>(NormalForm::kNfkd);
  if (type == "Prepend") return std::make_unique<Prepend>(stringField(spec, "prepend", where));
  if (type == "Replace") {
    bool is_regex = false;
    std::string pattern = patternField(spec, is_regex, where);
    return std::make_unique<Replace>(std::move(pattern), is_regex,
                                     stringField(spec, "content", where));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const auto& step : arrayField(spec, "normalizers", where)) {
      auto made = makeNormalizer(step, where);
      if (made) steps.push_back(std::move(made));
    }
    return std::make_unique<Sequence>(std::move(steps));
  }
  throwUnsupported(where, type, {"NFC", "NFD", "NFKC", "NFKD", "Prepend", "Replace", "Sequence"});
}

}  // namespace cxxlaunch::text
