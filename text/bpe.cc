#include "text/bpe.h"

#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>

#include "common/error.h"
#include "text/json_fields.h"
#include "text/unicode.h"

namespace cxxlaunch::text {
namespace {

constexpr size_t kCacheCapacity = 10'000;
constexpr size_t kCacheMaxWordBytes = 256;

uint64_t pairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// One symbol of a word being merged: a doubly linked list over a vector, as the library's Word.
struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  bool removed;
};

// A candidate merge: lowest rank first, then leftmost.
struct Candidate {
  uint32_t rank;
  int32_t pos;
  int32_t new_id;
  bool operator>(const Candidate& other) const {
    return rank != other.rank ? rank > other.rank : pos > other.pos;
  }
};

}  // namespace

std::unique_ptr<Bpe> Bpe::fromJson(const nlohmann::json& model, const std::string& where) {
  std::unique_ptr<Bpe> bpe(new Bpe());
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    throw InvalidArgument(where + ": field 'vocab' is missing or not an object");
  }
  bpe->vocab_.reserve(model["vocab"].size());
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      throw InvalidArgument(where + ": the id of vocabulary entry '" + token +
                            "' is not an integer in [0, 2^31)");
    }
    bpe->vocab_.emplace(token, id.get<int32_t>());
  }
  if (model.contains("continuing_subword_prefix") &&
      model["continuing_subword_prefix"].is_string()) {
    bpe->continuing_subword_prefix_ = model["continuing_subword_prefix"].get<std::string>();
  }
  if (model.contains("end_of_word_suffix") && model["end_of_word_suffix"].is_string()) {
    bpe->end_of_word_suffix_ = model["end_of_word_suffix"].get<std::string>();
  }
  bpe->fuse_unk_ = boolField(model, "fuse_unk", false, where);
  bpe->byte_fallback_ = boolField(model, "byte_fallback", false, where);
  bpe->ignore_merges_ = boolField(model, "ignore_merges", false, where);
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const auto unk = model["unk_token"].get<std::string>();
    const auto found = bpe->vocab_.find(unk);
    if (found == bpe->vocab_.end()) {
      throw InvalidArgument(where + ": unk_token '" + unk + "' is not in the vocabulary");
    }
    bpe->unk_id_ = found->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    const auto found = bpe->vocab_.find(std::string_view(name));
    bpe->byte_ids_[b] = found == bpe->vocab_.end() ? -1 : found->second;
  }

  const auto& merges = arrayField(model, "merges", where);
  bpe->merges_.reserve(merges.size());
  const size_t prefix_length = bpe->continuing_subword_prefix_.size();
  uint32_t rank = 0;
  for (const auto& merge : merges) {
    std::string left, right;
    if (merge.is_string()) {  // "a b": the older form, split at the first space
      const auto text = merge.get<std::string>();
      const size_t space = text.find(' ');
      if (space == std::string::npos) {
        throw InvalidArgument(where + ": merge " + std::to_string(rank) + " '" + text +
                              "' is not two tokens separated by a space");
      }
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      throw InvalidArgument(where + ": merge " + std::to_string(rank) +
                            " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    auto idOf = [&](const std::string& token) {
      const auto found = bpe->vocab_.find(token);
      if (found == bpe->vocab_.end()) {
        throw InvalidArgument(where + ": merge " + std::to_string(rank) + " ('" + left + "', '" +
                              right + "') names '" + token + "', which is not in the vocabulary");
      }
      return found->second;
    };
    const std::string merged =
        left + (right.size() >= prefix_length ? right.substr(prefix_length) : right);
    // A later duplicate of a pair replaces the earlier one, as collecting into a map does there.
    bpe->merges_[pairKey(idOf(left), idOf(right))] = {rank, idOf(merged)};
    ++rank;
  }
  return bpe;
}

void Bpe::mergeWord(std::string_view word, std::vector<int32_t>& out) const {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  int32_t pending_unk = -1;  // an unknown not yet added (fuse_unk joins the next)
  auto add = [&](int32_t id) {
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, false});
  };
  std::string piece;
  for (size_t i = 0; i < word.size();) {
    const size_t begin = i;
    nextCodePoint(word, i);
    const bool is_first = begin == 0, is_last = i == word.size();
    piece.clear();
    if (!is_first) piece += continuing_subword_prefix_;
    piece.append(word.substr(begin, i - begin));
    if (is_last) piece += end_of_word_suffix_;
    const auto found = vocab_.find(piece);
    if (found != vocab_.end()) {
      if (pending_unk >= 0) add(pending_unk);
      pending_unk = -1;
      add(found->second);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (const char c : piece) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        // As the library: a pending unknown stays pending across byte tokens.
        for (const char c : piece) add(byte_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = *unk_id_;
    }
  }
  if (pending_unk >= 0) add(pending_unk);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto offer = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    const auto found = merges_.find(pairKey(symbols[pos].id, symbols[next].id));
    if (found != merges_.end()) queue.push({found->second.first, pos, found->second.second});
  };
  for (int32_t pos = 0; pos + 1 < static_cast<int32_t>(symbols.size()); ++pos) offer(pos);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.removed || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    // A stale entry: one of the two has merged with another neighbour since it was queued.
    const auto found = merges_.find(pairKey(left.id, right.id));
    if (found == merges_.end() || found->second.second != top.new_id) continue;
    left.id = top.new_id;
    right.removed = true;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) offer(left.prev);
    offer(top.pos);
  }
  for (const auto& s : symbols) {
    if (!s.removed) out.push_back(s.id);
  }
}

void Bpe::tokenize(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    const auto found = vocab_.find(word);
    if (found != vocab_.end()) {
      ids.push_back(found->second);
      return;
    }
  }
  {
    std::shared_lock lock(cache_mutex_);
    const auto hit = cache_.find(word);
    if (hit != cache_.end()) {
      ids.insert(ids.end(), hit->second.begin(), hit->second.end());
      return;
    }
  }
  const size_t first = ids.size();
  mergeWord(word, ids);
  if (word.size() < kCacheMaxWordBytes) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) {
      cache_.emplace(std::string(word), std::vector<int32_t>(ids.begin() + first, ids.end()));
    }
  }
}

}  // namespace cxxlaunch::text
