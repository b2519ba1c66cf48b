#pragma once
// Normalizers of tokenizer.json, built from the "normalizer" object by its "type": NFC, NFD,
// NFKC, NFKD (ICU), Prepend, Replace, and Sequence of these. A null normalizer is no normalizer
// (makeNormalizer returns nullptr). Immutable once built; thread-safe.

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace cxxlaunch::text {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites `text` (well-formed UTF-8) in place.
  virtual void normalize(std::string& text) const = 0;
};

// Throws InvalidArgument naming an unsupported type, or a field that is missing or of the wrong
// kind; `where` prefixes the message (e.g. "DIR/tokenizer.json: normalizer").
std::unique_ptr<Normalizer> makeNormalizer(const nlohmann::json& spec, const std::string& where);

}  // namespace cxxlaunch::text
