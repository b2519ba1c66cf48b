#include "apps/examples/tokens.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <stdexcept>

#include "common/error.h"
#include "common/file.h"
#ifdef CXXLAUNCH_WITH_TEXT
#include "text/tokenizer.h"
#endif

namespace cxxlaunch::examples {
namespace {

namespace fs = std::filesystem;

// The ids of `data` under the SentencePiece model `sp_model`, from finetune_tokenize (beside this
// binary; it says why it is a process of its own); `pieces`: the model's piece count.
std::vector<int64_t> sentencePieceTokens(const std::string& sp_model, const std::string& data,
                                         int64_t& pieces) {
  const std::string helper =
      (fs::read_symlink("/proc/self/exe").parent_path() / "finetune_tokenize").string();
  if (!fs::exists(helper)) {
    throw std::runtime_error(helper +
                             " is missing: finetune tokenizes with it (build target "
                             "finetune_tokenize)");
  }
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  if (::pipe2(err, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  std::string arg0 = helper, arg1 = sp_model, arg2 = data;
  char* argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, helper.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  ::close(err[1]);
  auto drain = [](int fd) {
    std::string bytes;
    char buffer[1 << 16];
    for (ssize_t n; (n = ::read(fd, buffer, sizeof(buffer))) != 0;) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) break;
      bytes.append(buffer, static_cast<size_t>(n));
    }
    ::close(fd);
    return bytes;
  };
  // The ids first: the helper's stderr is one short line, which its pipe holds while we read.
  const std::string ids = drain(out[0]);
  std::string message = drain(err[0]);
  if (spawned != 0) throw std::runtime_error("cannot start " + helper + ": " + strerror(spawned));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || ids.size() < sizeof(int32_t)) {
    if (message.rfind("error: ", 0) == 0) message.erase(0, 7);
    while (!message.empty() && message.back() == '\n') message.pop_back();
    if (WIFEXITED(status) && WEXITSTATUS(status) == 2) throw InvalidArgument(message);
    throw std::runtime_error(helper + " failed: " + message);
  }
  std::vector<int64_t> tokens(ids.size() / sizeof(int32_t) - 1);
  int32_t value = 0;
  for (size_t i = 0; i <= tokens.size(); ++i) {
    std::memcpy(&value, ids.data() + i * sizeof(int32_t), sizeof(int32_t));
    (i == 0 ? pieces : tokens[i - 1]) = value;
  }
  return tokens;
}

}  // namespace

Tokens tokenizeFile(const std::string& model_dir, const std::string& data, int64_t vocab_size) {
  Tokens out;
  std::vector<int64_t>& tokens = out.ids;
  struct stat st {};
#ifdef CXXLAUNCH_WITH_TEXT
  // tokenizer.json first, as transformers' AutoTokenizer prefers the fast tokenizer: the only
  // tokenizer of Llama 3 and Qwen2/2.5/3 folders (text/, docs/text.md).
  const std::string hf_json = model_dir + "/tokenizer.json";
  if (::lstat(hf_json.c_str(), &st) == 0) {
    const text::Tokenizer tokenizer = text::Tokenizer::fromFolder(model_dir);
    if (tokenizer.vocabSize() > vocab_size) {
      throw InvalidArgument(hf_json + " has " + std::to_string(tokenizer.vocabSize()) +
                            " tokens, more than the model's vocab_size " +
                            std::to_string(vocab_size));
    }
    // Each line on its own, without its newline and without BOS/EOS, as the SentencePiece path
    // below and HF's run_clm example feed lines.
    const std::string text = readRegularFile(data, "--data", std::numeric_limits<size_t>::max());
    size_t line_number = 0;
    for (size_t begin = 0; begin < text.size();) {
      size_t end = text.find('\n', begin);
      if (end == std::string::npos) end = text.size();
      ++line_number;
      try {
        for (const int32_t id : tokenizer.encode(std::string_view(text).substr(begin, end - begin),
                                                 /*add_special_tokens=*/false)) {
          tokens.push_back(id);
        }
      } catch (const InvalidArgument& e) {
        throw InvalidArgument("--data '" + data + "' line " + std::to_string(line_number) + ": " +
                              e.what());
      }
      begin = end + 1;
    }
    out.tokenizer = "tokenizer.json " + hf_json;
    return out;
  }
#endif
  const std::string sp_model = model_dir + "/tokenizer.model";
  // lstat: a dangling or looping link named tokenizer.model is an error below, not "no model".
  if (::lstat(sp_model.c_str(), &st) != 0) {
    if (vocab_size < 256) {
      throw InvalidArgument(model_dir + " has no tokenizer.model, and its vocab_size " +
                            std::to_string(vocab_size) +
                            " is below 256: byte tokens need 256 (add a SentencePiece model)");
    }
    out.tokenizer = "bytes";
    const std::string text = readRegularFile(data, "--data", std::numeric_limits<size_t>::max());
    tokens.reserve(text.size());
    for (const char c : text) tokens.push_back(static_cast<unsigned char>(c));
    return out;
  }
  // Both checked here, so that what is wrong with them is said in this process's words; the
  // helper opens them the same way.
  (void)openRegularFile(sp_model, "tokenizer.model", kMaxTokenizerBytes);
  (void)openRegularFile(data, "--data");
  int64_t pieces = 0;
  tokens = sentencePieceTokens(sp_model, data, pieces);
  if (pieces > vocab_size) {
    throw InvalidArgument(sp_model + " has " + std::to_string(pieces) +
                          " pieces, more than the model's vocab_size " +
                          std::to_string(vocab_size));
  }
  out.tokenizer = "SentencePiece " + sp_model;
  return out;
}

}  // namespace cxxlaunch::examples
