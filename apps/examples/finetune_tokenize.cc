// finetune_tokenize: finetune's SentencePiece tokenizer, as a process of its own.
//
//   finetune_tokenize MODEL.model TEXT_FILE > ids
//
// Writes to stdout, as int32 in the machine's byte order (its reader is finetune, here): the
// model's piece count, then the ids of every non-empty line of TEXT_FILE, each line encoded on its
// own (newlines dropped, no BOS). Exit codes: 0 done; 2 an unreadable model or file, with one
// `error:` line on stderr.
//
// Why a process: Debian's libsentencepiece carries its own copy of protobuf (3.14) with the
// symbols exported, and a process that also loads LibTorch loads the system's libprotobuf
// (3.21): sentencepiece's calls then bind to the other version, whose version check aborts the
// first Load(). Here no LibTorch is loaded (RTLD_DEEPBIND would do it in-process, but no
// sanitizer runtime allows it).

#include <sentencepiece_processor.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace {

int fail(const std::string& message) {
  std::cerr << "error: " << message << "\n";
  return 2;
}

bool write(const std::vector<int32_t>& ids) {
  return std::fwrite(ids.data(), sizeof(int32_t), ids.size(), stdout) == ids.size();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return fail("usage: finetune_tokenize MODEL.model TEXT_FILE");
  sentencepiece::SentencePieceProcessor sp;
  if (const auto status = sp.Load(argv[1]); !status.ok()) {
    return fail(std::string("cannot load ") + argv[1] + ": " + status.ToString());
  }
  std::ifstream in(argv[2], std::ios::binary);
  if (!in) return fail(std::string("cannot read ") + argv[2]);
  std::vector<int32_t> out;
  out.push_back(sp.GetPieceSize());
  std::vector<int> ids;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    if (const auto status = sp.Encode(line, &ids); !status.ok()) {
      return fail(std::string("cannot tokenize ") + argv[2] + ": " + status.ToString());
    }
    out.insert(out.end(), ids.begin(), ids.end());
    // Flushed in pieces: a big file's ids never all sit in memory twice.
    if (out.size() >= (1u << 20)) {
      if (!write(out)) return fail("cannot write the ids to stdout");
      out.clear();
    }
  }
  if (!write(out) || std::fflush(stdout) != 0) {
    return fail("cannot write the ids to stdout");
  }
  return 0;
}
