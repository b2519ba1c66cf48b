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
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "apps/examples/tokens.h"
#include "common/error.h"
#include "common/file.h"

namespace {

int fail(const std::string& message) {
  std::cerr << "error: " << message << "\n";
  return 2;
}

bool write(const std::vector<int32_t>& ids) {
  return std::fwrite(ids.data(), sizeof(int32_t), ids.size(), stdout) == ids.size();
}

// The ids of every non-empty line of `text` (an open regular file) to stdout. Returns "" or why
// not.
std::string encodeLines(const sentencepiece::SentencePieceProcessor& sp, int fd,
                        const std::string& path, std::vector<int32_t>& out) {
  std::vector<int> ids;
  auto encode = [&](std::string_view line) -> std::string {
    if (line.empty()) return "";
    if (const auto status = sp.Encode(line, &ids); !status.ok()) {
      return "cannot tokenize " + path + ": " + status.ToString();
    }
    out.insert(out.end(), ids.begin(), ids.end());
    // Flushed in pieces: a big file's ids never all sit in memory twice.
    if (out.size() >= (1u << 20)) {
      if (!write(out)) return "cannot write the ids to stdout";
      out.clear();
    }
    return "";
  };
  std::string pending;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return "cannot read " + path + ": " + std::strerror(errno);
    if (n == 0) break;
    pending.append(buffer, static_cast<size_t>(n));
    size_t begin = 0;
    for (size_t end; (end = pending.find('\n', begin)) != std::string::npos; begin = end + 1) {
      if (auto why = encode(std::string_view(pending).substr(begin, end - begin)); !why.empty()) {
        return why;
      }
    }
    pending.erase(0, begin);
  }
  return encode(pending);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return fail("usage: finetune_tokenize MODEL.model TEXT_FILE");
  sentencepiece::SentencePieceProcessor sp;
  std::vector<int32_t> out;
  try {
    // Both opened as finetune opens every file a user names: a FIFO or a directory is refused,
    // never waited on.
    const std::string model = cxxlaunch::readRegularFile(argv[1], "tokenizer.model",
                                                         cxxlaunch::examples::kMaxTokenizerBytes);
    if (const auto status = sp.LoadFromSerializedProto(model); !status.ok()) {
      return fail(std::string("cannot load ") + argv[1] + ": " + status.ToString());
    }
    const cxxlaunch::OpenFile text = cxxlaunch::openRegularFile(argv[2], "--data");
    out.push_back(sp.GetPieceSize());
    if (const std::string why = encodeLines(sp, text.fd(), argv[2], out); !why.empty()) {
      return fail(why);
    }
  } catch (const cxxlaunch::InvalidArgument& e) {
    return fail(e.what());
  }
  if (!write(out) || std::fflush(stdout) != 0) {
    return fail("cannot write the ids to stdout");
  }
  return 0;
}
