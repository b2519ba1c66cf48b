#pragma once
// A run's training examples (text/sft_data.h) kept on disk, so that the next run with the same
// data, tokenizer and settings reads them instead of tokenizing again.
//
//   auto data = cxxlaunch::text::loadOrTokenize("train.jsonl", model_dir, tok, chat_or_null,
//                                               options, /*cache_dir=*/"");
//   data.examples;   // what readTrainingExamples would return
//   data.cache_hit;  // read from data.cache_file
//
// One file per key, DIR/<key>.tokens, where the key is the SHA-256 (OpenSSL) of: the data
// file's bytes, the model folder's tokenizer.json, tokenizer_config.json and chat_template.jinja
// (each file's SHA-256, or its absence), whether a chat template is given, the DataOptions and
// the cache's format version. Any change gives another key, so another file: a cache made with
// another tokenizer is never read. The file repeats its key and ends with the SHA-256 of its
// contents; a file that is short, damaged, of another key or not a regular file (a symlink is
// never followed) is ignored and written anew. Files are written under a temporary name, fsynced
// and renamed into place (common/atomic_file.h): a reader sees a whole file or none. Several
// processes (the ranks of a run) may fill the same cache at once; the last rename wins, and each
// file is whole.
//
// The default folder is $XDG_CACHE_HOME/cxxlaunch/tokens, else $HOME/.cache/cxxlaunch/tokens,
// made with mode 0700 when missing. Nothing removes old files: delete the folder to reclaim it.
//
// No LibTorch. Thread-safety: free functions; concurrent calls are safe.

#include <string>
#include <string_view>
#include <vector>

#include "text/sft_data.h"

namespace cxxlaunch::text {

struct CachedExamples {
  std::vector<TrainingExample> examples;
  bool cache_hit = false;
  std::string cache_file;  // the file read or written; empty when there is no cache folder
  // Why an existing file was not used ("damaged", "a symlink", ...), or why the examples could
  // not be written (the examples are right either way); empty when neither happened.
  std::string note;
};

// $XDG_CACHE_HOME/cxxlaunch/tokens, else $HOME/.cache/cxxlaunch/tokens; empty when neither
// variable is set (then loadOrTokenize does not cache).
std::string defaultTokenCacheDir();

// The key (64 hex digits) of the examples of the JSON-lines `data` for the tokenizer files of
// `model_dir`. Throws InvalidArgument when a file of the folder exists but cannot be read.
std::string tokenCacheKey(std::string_view data, const std::string& model_dir, bool has_chat,
                          const DataOptions& options);

// readTrainingExamples(jsonl_path, tokenizer, chat, options), through the cache in `cache_dir`
// (empty: defaultTokenCacheDir()). `tokenizer` and `chat` must be those of `model_dir`. Throws
// what readTrainingExamples throws; a cache that cannot be read or written is never an error
// (it is said in `note`).
CachedExamples loadOrTokenize(const std::string& jsonl_path, const std::string& model_dir,
                              const Tokenizer& tokenizer, const ChatTemplate* chat,
                              const DataOptions& options, const std::string& cache_dir);

}  // namespace cxxlaunch::text
