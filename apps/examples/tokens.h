#pragma once
// finetune's tokenization of a text file for an HF model folder: the folder's tokenizer.json
// through text/ when there is one, else its tokenizer.model through SentencePiece (either way each
// line of the file encoded on its own, newlines dropped, no BOS: as HF's run_clm example feeds
// lines), else bytes (token = byte value). The
// SentencePiece side runs in the process finetune_tokenize, beside the calling binary
// (finetune_tokenize.cc says why).
//
// Thread-safety: none needed (no shared state); each call may start a process.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cxxlaunch::examples {

struct Tokens {
  std::vector<int64_t> ids;
  std::string tokenizer;  // "bytes", "SentencePiece <path>" or "tokenizer.json <path>", for the log
};

// The largest tokenizer.model or tokenizer.json read or copied (the largest vocabularies' are
// tens of MiB).
inline constexpr size_t kMaxTokenizerBytes = size_t{256} << 20;

// Throws InvalidArgument for an unreadable `data` or tokenizer.model (each opened as
// common/file.h's openRegularFile does: a directory, a FIFO or a device is refused at once), a
// vocabulary below 256 without a tokenizer.model, or a tokenizer with more pieces than
// `vocab_size`.
Tokens tokenizeFile(const std::string& model_dir, const std::string& data, int64_t vocab_size);

}  // namespace cxxlaunch::examples
