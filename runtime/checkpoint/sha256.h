#pragma once
// SHA-256 (FIPS 180-4), for fingerprints that name content (a LoRA checkpoint's base model:
// model_source.h). Plain C++: the checkpoint formats link no crypto library.
//
// Thread-safety: one object per thread.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace cxxlaunch::runtime::checkpoint {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  void update(const std::string& text) { update(text.data(), text.size()); }
  // The digest as 64 lowercase hex digits; the object is spent after it.
  std::string hexDigest();

 private:
  void compress(const unsigned char* block);

  std::array<uint32_t, 8> h_;
  std::array<unsigned char, 64> block_{};
  size_t used_ = 0;     // bytes in block_
  uint64_t total_ = 0;  // bytes hashed
};

}  // namespace cxxlaunch::runtime::checkpoint
