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

void applyToEach(std::vector<std::string>& pieces,
                 const std::function<void(std::string&, std::vector<std::string>&)>& split) {
  std::vector<std::string> out;
  out.reserve(pieces.size());
  for (auto& piece : pieces) split(piece, out);
  pieces.swap(out);
}

class Split final : public PreTokenizer {
 public:
  Split(std::string pattern, bool is_regex, SplitBehavior behavior, bool invert)
      : literal_(std::move(pattern)), behavior_(behavior), invert_(invert) {
    if (is_regex) regex_ = std::make_unique<Regex>(literal_);
  }
  void preTokenize(std::vector<std::string>& pieces) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    applyToEach(pieces, [&](std::string& piece, std::vector<std::string>& out) {
      matches.clear();
      if (regex_) {
        regex_->findAll(piece, matches);
      } else {
        findAllLiteral(piece, literal_, matches);
      }
      for (auto& p : splitByMatches(piece, matches, behavior_, invert_))
        out.push_back(std::move(p));
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
  void preTokenize(std::vector<std::string>& pieces) const override {
    if (add_prefix_space_ || regex_) {
      std::vector<std::pair<size_t, size_t>> matches;
      applyToEach(pieces, [&](std::string& piece, std::vector<std::string>& out) {
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

class Sequence final : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void preTokenize(std::vector<std::string>& pieces) const override {
    for (const auto& step : steps_) step->preTokenize(pieces);
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
                                        SplitBehavior behavior, bool invert) {
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
    if (!o.removed && o.end > o.begin) pieces.push_back(text.substr(o.begin, o.end - o.begin));
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
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (const auto& step : arrayField(spec, "pretokenizers", where)) {
      auto made = makePreTokenizer(step, where);
      if (made) steps.push_back(std::move(made));
    }
    return std::make_unique<Sequence>(std::move(steps));
  }
  throwUnsupported(where, type, {"Split", "ByteLevel", "Sequence"});
}

}  // namespace cxxlaunch::text
