#include "text/token_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>

#include "common/atomic_file.h"
#include "common/error.h"
#include "common/file.h"
#include "common/sha256.h"

namespace cxxlaunch::text {
namespace {

// Bump when what a file holds or how examples are made changes (the tokenizer's or the masks'
// rules): the key changes with it, so older files are never read.
constexpr uint32_t kFormatVersion = 1;
constexpr char kMagic[8] = {'C', 'X', 'L', 'T', 'O', 'K', 'S', '\n'};
constexpr uint32_t kByteOrder = 0x01020304;
constexpr size_t kDigestBytes = 32;

using Digest = std::array<unsigned char, kDigestBytes>;

Digest sha256(std::string_view bytes) {
  Sha256 h;
  h.update(bytes);
  return h.digest();
}

std::string sha256Hex(std::string_view bytes) {
  Sha256 h;
  h.update(bytes);
  return h.hexDigest();
}

// The header: magic, format version, byte order, key, example count, token count; then each
// example's length (u64), all input_ids, all labels (int32), and the SHA-256 of all before it.
struct Header {
  char magic[8];
  uint32_t version;
  uint32_t byte_order;
  unsigned char key[kDigestBytes];
  uint64_t examples;
  uint64_t tokens;
};
static_assert(sizeof(Header) == 64, "the header has no padding");

Digest keyDigest(const std::string& key_hex) {
  Digest d{};
  for (size_t i = 0; i < kDigestBytes; ++i) {
    d[i] = static_cast<unsigned char>(std::stoul(key_hex.substr(2 * i, 2), nullptr, 16));
  }
  return d;
}

// The file's examples, or nullopt with `why` when it is not a whole file of `key`.
std::optional<std::vector<TrainingExample>> readCacheFile(const std::string& path,
                                                          const Digest& key, std::string& why) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return std::nullopt;  // nothing there
    why = errno == ELOOP ? "it is a symlink, which the cache never follows"
                         : std::string("cannot open it: ") + std::strerror(errno);
    return std::nullopt;
  }
  std::string bytes;
  struct stat st {};
  bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (regular) {
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    bytes.resize(done);
  }
  ::close(fd);
  if (!regular) {
    why = "it is not a regular file";
    return std::nullopt;
  }
  Header h{};
  if (bytes.size() < sizeof(Header) + kDigestBytes) {
    why = "it is damaged (too short)";
    return std::nullopt;
  }
  std::memcpy(&h, bytes.data(), sizeof(Header));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 || h.version != kFormatVersion ||
      h.byte_order != kByteOrder) {
    why = "it is not a token cache of this version";
    return std::nullopt;
  }
  if (std::memcmp(h.key, key.data(), kDigestBytes) != 0) {
    why = "it was made from other data, tokenizer or settings";
    return std::nullopt;
  }
  const uint64_t room = (bytes.size() - sizeof(Header) - kDigestBytes);
  if (h.examples > room / 8 || h.tokens > room / 8 || h.examples * 8 + h.tokens * 8 != room) {
    why = "it is damaged (its size does not match its header)";
    return std::nullopt;
  }
  const size_t body = bytes.size() - kDigestBytes;
  if (std::memcmp(sha256(std::string_view(bytes.data(), body)).data(), bytes.data() + body,
                  kDigestBytes) != 0) {
    why = "it is damaged (its checksum does not match)";
    return std::nullopt;
  }
  const char* p = bytes.data() + sizeof(Header);
  const char* ids = p + h.examples * 8;
  const char* labels = ids + h.tokens * 4;
  std::vector<TrainingExample> out(h.examples);
  uint64_t at = 0;
  for (auto& e : out) {
    uint64_t n = 0;
    std::memcpy(&n, p, 8);
    p += 8;
    if (n > h.tokens - at) {
      why = "it is damaged (its lengths do not add up)";
      return std::nullopt;
    }
    e.input_ids.resize(n);
    e.labels.resize(n);
    std::memcpy(e.input_ids.data(), ids + at * 4, n * 4);
    std::memcpy(e.labels.data(), labels + at * 4, n * 4);
    at += n;
  }
  if (at != h.tokens) {
    why = "it is damaged (its lengths do not add up)";
    return std::nullopt;
  }
  return out;
}

void writeCacheFile(const std::string& path, const Digest& key,
                    const std::vector<TrainingExample>& examples) {
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = kFormatVersion;
  h.byte_order = kByteOrder;
  std::memcpy(h.key, key.data(), kDigestBytes);
  h.examples = examples.size();
  for (const auto& e : examples) h.tokens += e.input_ids.size();
  AtomicFile file(path, Durability::kPowerLoss, Writes::kThroughPageCache, 0644);
  Sha256 checksum;
  // Examples are small: gathered into 1 MiB writes rather than one system call each.
  std::string buffer;
  auto flush = [&] {
    file.append(buffer.data(), buffer.size());
    checksum.update(buffer.data(), buffer.size());
    buffer.clear();
  };
  auto append = [&](const void* data, size_t bytes) {
    buffer.append(static_cast<const char*>(data), bytes);
    if (buffer.size() >= (size_t{1} << 20)) flush();
  };
  append(&h, sizeof(h));
  for (const auto& e : examples) {
    const uint64_t n = e.input_ids.size();
    append(&n, sizeof(n));
  }
  for (const auto& e : examples) append(e.input_ids.data(), e.input_ids.size() * 4);
  for (const auto& e : examples) append(e.labels.data(), e.labels.size() * 4);
  flush();
  const Digest sum = checksum.digest();
  file.append(sum.data(), sum.size());
  file.commit();
}

// Makes `dir` and its missing parents with mode 0700. Returns an empty string, or why not.
std::string makeFolders(const std::string& dir) {
  std::filesystem::path so_far;
  for (const auto& part : std::filesystem::path(dir)) {
    so_far /= part;
    if (::mkdir(so_far.c_str(), 0700) != 0 && errno != EEXIST) {
      return "cannot make " + so_far.string() + ": " + std::strerror(errno);
    }
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return dir + " is not a folder";
  return "";
}

}  // namespace

std::string defaultTokenCacheDir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && *xdg == '/') return std::string(xdg) + "/cxxlaunch/tokens";
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home != '\0') return std::string(home) + "/.cache/cxxlaunch/tokens";
  return "";
}

std::string tokenCacheKey(std::string_view data, const std::string& model_dir, bool has_chat,
                          const DataOptions& options) {
  std::string material = "cxxlaunch token cache " + std::to_string(kFormatVersion) + "\n";
  material += "data " + sha256Hex(data) + "\n";
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
    const std::string path = model_dir + "/" + name;
    std::error_code ec;
    const bool present = std::filesystem::exists(path, ec);
    const std::string digest =
        present ? sha256Hex(readRegularFile(path, name, std::numeric_limits<size_t>::max()))
                : "absent";
    material += std::string(name) + " " + digest + "\n";
  }
  material += "chat_template " + std::to_string(has_chat ? 1 : 0) + "\n";
  material += "max_length " + std::to_string(options.max_length) + "\n";
  material += "truncation " + std::to_string(options.truncation ? 1 : 0) + "\n";
  return sha256Hex(material);
}

CachedExamples loadOrTokenize(const std::string& jsonl_path, const std::string& model_dir,
                              const Tokenizer& tokenizer, const ChatTemplate* chat,
                              const DataOptions& options, const std::string& cache_dir) {
  const std::string data =
      readRegularFile(jsonl_path, "--data", std::numeric_limits<size_t>::max());
  CachedExamples out;
  const std::string dir = cache_dir.empty() ? defaultTokenCacheDir() : cache_dir;
  if (dir.empty()) {
    out.examples = tokenizeTrainingExamples(data, jsonl_path, tokenizer, chat, options);
    return out;
  }
  const std::string key = tokenCacheKey(data, model_dir, chat != nullptr, options);
  out.cache_file = dir + "/" + key + ".tokens";
  std::string why;
  if (auto cached = readCacheFile(out.cache_file, keyDigest(key), why)) {
    out.examples = std::move(*cached);
    out.cache_hit = true;
    return out;
  }
  if (!why.empty()) out.note = "ignored the token cache " + out.cache_file + ": " + why;
  out.examples = tokenizeTrainingExamples(data, jsonl_path, tokenizer, chat, options);
  std::string not_written = makeFolders(dir);
  if (not_written.empty()) {
    try {
      writeCacheFile(out.cache_file, keyDigest(key), out.examples);
    } catch (const std::exception& e) {
      not_written = e.what();
    }
  }
  if (!not_written.empty()) {
    if (!out.note.empty()) out.note += "; ";
    out.note += "could not write the token cache " + out.cache_file + ": " + not_written;
  }
  return out;
}

}  // namespace cxxlaunch::text
