#pragma once
// Decoders of tokenizer.json ("decoder"), built by "type": ByteLevel (GPT-2's characters back to
// bytes, then lossy UTF-8), and for SentencePiece-style files Replace, ByteFallback (<0xNN>
// tokens back to bytes), Fuse and Strip; Sequence of these. Each works on the list of token
// strings, as the library's decode_chain, and the result is their concatenation. Immutable once
// built; thread-safe.

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace cxxlaunch::text {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decodeChain(std::vector<std::string>& tokens) const = 0;
};

// Throws InvalidArgument naming an unsupported type or a bad field; `where` prefixes it. A null
// decoder gives nullptr (the tokens are then joined with spaces, as the library does).
std::unique_ptr<Decoder> makeDecoder(const nlohmann::json& spec, const std::string& where);

}  // namespace cxxlaunch::text
