#include "text/pre_tokenizer.h"

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "text/json_fields.h"
#include "text/regex.h"
#include "text/unicode.h"

namespace cxxlaunch::text {
namespace {

// GPT-2's pattern, which ByteLevel applies when `use_regex` is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Runs `split` on each piece; keeps `first_at_start` only when the first piece's output begins
// where it did.
void applyToEach(std::vector<std::string>& pieces, bool& first_at_start,
                 const std::function<void(std::string&, std::vector<std::string>&, bool&)>& split) {
  std::vector<std::string> out;
  out.reserve(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const size_t before = out.size();
    bool starts_at_zero = true;
    split(pieces[i], out, starts_at_zero);
    if (i == 0) first_at_start = first_at_start && starts_at_zero && out.size() > before;
  }
  pieces.swap(out);
}

class Split final : public PreTokenizer {
 public:
  Split(std::string pattern, bool is_regex, SplitBehavior behavior, bool invert)
      : literal_(std::move(pattern)), behavior_(behavior), invert_(invert) {
    if (is_regex) regex_ = std::make_unique<Regex>(literal_);
  }
  void preTokenize(std::vector<std::string>& pieces, bool& first_at_start) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    applyToEach(
        pieces, first_at_start,
        [&](std::string& piece, std::vector<std::string>& out, bool& starts_at_zero) {
          matches.clear();
          if (regex_) {
            regex_->findAll(piece, matches);
          } else {
            findAllLiteral(piece, literal_, matches);
          }
          for (auto& p : splitByMatches(piece, matches, behavior_, invert_, &starts_at_zero)) {
            out.push_back(std::move(p));
          }
        });
  }

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex) regex_ = std::make_unique<Regex>(kGpt2Pattern);
  }
  void preTokenize(std::vector<std::string>& pieces, bool& first_at_start) const override {
    if (add_prefix_space_ || regex_) {
      std::vector<std::pair<size_t, size_t>> matches;
      applyToEach(
          pieces, first_at_start, [&](std::string& piece, std::vector<std::string>& out, bool&) {
            // As NormalizedString::prepend: nothing is put before an empty piece.
            if (add_prefix_space_ && !piece.empty() && piece[0] != ' ')
              piece.insert(piece.begin(), ' ');
            if (!regex_) {
              if (!piece.empty()) out.push_back(std::move(piece));
              return;
            }
            matches.clear();
            regex_->findAll(piece, matches);
            for (auto& p : splitByMatches(piece, matches, SplitBehavior::kIsolated, false)) {
              out.push_back(std::move(p));
            }
          });
    }
    for (auto& piece : pieces) {
      std::string mapped;
      mapped.reserve(piece.size() * 2);
      for (const char c : piece) mapped += byteToUnicode(static_cast<uint8_t>(c));
      piece.swap(mapped);
    }
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

// Metaspace: SentencePiece's view of spaces.
class Metaspace final : public PreTokenizer {
 public:
  enum class Prepend { kAlways, kFirst, kNever };
  Metaspace(std::string replacement, Prepend prepend, bool split)
      : replacement_(std::move(replacement)), prepend_(prepend), split_(split) {}
  void preTokenize(std::vector<std::string>& pieces, bool& first_at_start) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    for (size_t i = 0; i < pieces.size(); ++i) {
      std::string& piece = pieces[i];
      if (piece.find(' ') != std::string::npos) {
        std::string replaced;
        for (const char c : piece) {
          if (c == ' ') {
            replaced += replacement_;
          } else {
            replaced += c;
          }
        }
        piece.swap(replaced);
      }
      const bool prepend =
          prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && i == 0 && first_at_start);
      // As NormalizedString::prepend: nothing is put before an empty piece.
      if (prepend && !piece.empty() && piece.compare(0, replacement_.size(), replacement_) != 0) {
        piece.insert(0, replacement_);
      }
    }
    if (!split_) return;
    applyToEach(pieces, first_at_start,
                [&](std::string& piece, std::vector<std::string>& out, bool& starts_at_zero) {
                  matches.clear();
                  findAllLiteral(piece, replacement_, matches);
                  for (auto& p : splitByMatches(piece, matches, SplitBehavior::kMergedWithNext,
                                                false, &starts_at_zero)) {
                    out.push_back(std::move(p));
                  }
                });
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
};

class Sequence final : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void preTokenize(std::vector<std::string>& pieces, bool& first_at_start) const override {
    for (const auto& step : steps_) step->preTokenize(pieces, first_at_start);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

SplitBehavior behaviorOf(const std::string& name, const std::string& where) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  throwUnsupported(where + " behavior", name,
                   {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"});
}

}  // namespace

std::vector<std::string> splitByMatches(const std::string& text,
                                        const std::vector<std::pair<size_t, size_t>>& matches,
                                        SplitBehavior behavior, bool invert, bool* starts_at_zero) {
  // The whole text as alternating ranges, each flagged as a match or not.
  struct Range {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Range> ranges;
  size_t last = 0;
  for (const auto& [begin, end] : matches) {
    if (begin > last) ranges.push_back({last, begin, false});
    ranges.push_back({begin, end, true});
    last = end;
  }
  if (last < text.size()) ranges.push_back({last, text.size(), false});
  if (invert) {
    for (auto& r : ranges) r.is_match = !r.is_match;
  }

  // Each behavior as the tokenizers library folds the ranges; `removed` marks what is dropped.
  struct Out {
    size_t begin, end;
    bool removed;
  };
  std::vector<Out> outs;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& r : ranges) outs.push_back({r.begin, r.end, false});
      break;
    case SplitBehavior::kRemoved:
      for (const auto& r : ranges) outs.push_back({r.begin, r.end, r.is_match});
      break;
    case SplitBehavior::kContiguous:
      for (const auto& r : ranges) {
        if (r.is_match == previous_match && !outs.empty()) {
          outs.back().end = r.end;
        } else {
          outs.push_back({r.begin, r.end, false});
        }
        previous_match = r.is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const auto& r : ranges) {
        if (r.is_match && !previous_match && !outs.empty()) {
          outs.back().end = r.end;
        } else {
          outs.push_back({r.begin, r.end, false});
        }
        previous_match = r.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto r = ranges.rbegin(); r != ranges.rend(); ++r) {
        if (r->is_match && !previous_match && !outs.empty()) {
          outs.back().begin = r->begin;
        } else {
          outs.push_back({r->begin, r->end, false});
        }
        previous_match = r->is_match;
      }
      std::reverse(outs.begin(), outs.end());
      break;
  }
  std::vector<std::string> pieces;
  pieces.reserve(outs.size());
  for (const auto& o : outs) {
    if (o.removed || o.end == o.begin) continue;
    if (pieces.empty() && starts_at_zero != nullptr) *starts_at_zero = o.begin == 0;
    pieces.push_back(text.substr(o.begin, o.end - o.begin));
  }
  return pieces;
}

std::unique_ptr<PreTokenizer> makePreTokenizer(const nlohmann::json& spec,
                                               const std::string& where) {
  if (spec.is_null()) return nullptr;
  const std::string type = typeOf(spec, where);
  if (type == "Split") {
    bool is_regex = false;
    std::string pattern = patternField(spec, is_regex, where);
    return std::make_unique<Split>(std::move(pattern), is_regex,
                                   behaviorOf(stringField(spec, "behavior", where), where),
                                   boolField(spec, "invert", false, where));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevel>(boolField(spec, "add_prefix_space", true, where),
                                       boolField(spec, "use_regex", true, where));
  }
  if (type == "Metaspace") {
    // Files written before prepend_scheme existed say add_prefix_space instead.
    auto prepend = boolField(spec, "add_prefix_space", true, where) ? Metaspace::Prepend::kAlways
                                                                    : Metaspace::Prepend::kNever;
    if (spec.contains("prepend_scheme") && !spec["prepend_scheme"].is_null()) {
      const std::string scheme = stringField(spec, "prepend_scheme", where);
      if (scheme == "always") {
        prepend = Metaspace::Prepend::kAlways;
      } else if (scheme == "first") {
        prepend = Metaspace::Prepend::kFirst;
      } else if (scheme == "never") {
        prepend = Metaspace::Prepend::kNever;
      } else {
        throwUnsupported(where + " prepend_scheme", scheme, {"always", "first", "never"});
      }
    }
    const std::string replacement = stringField(spec, "replacement", where);
    if (replacement.empty()) throw InvalidArgument(where + ": Metaspace's replacement is empty");
    return std::make_unique<Metaspace>(replacement, prepend, boolField(spec, "split", true, where));
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (const auto& step : arrayField(spec, "pretokenizers", where)) {
      auto made = makePreTokenizer(step, where);
      if (made) steps.push_back(std::move(made));
    }
    return std::make_unique<Sequence>(std::move(steps));
  }
  throwUnsupported(where, type, {"Split", "ByteLevel", "Metaspace", "Sequence"});
}

}  // namespace cxxlaunch::text
