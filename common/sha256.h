#pragma once
// SHA-256 (FIPS 180-4), for names of content: the token cache's keys and checksums
// (text/token_cache.h), a LoRA checkpoint's fingerprint of its base model
// (runtime/checkpoint/safetensors.h). Plain C++, checked against FIPS 180-4's test vectors
// (tests/common): every module can use it without linking a crypto library (the GPU bundle
// builds the runtime where none may be installed).
//
// Thread-safety: one object per thread.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace cxxlaunch {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  void update(std::string_view bytes) { update(bytes.data(), bytes.size()); }
  // The digest, raw or as 64 lowercase hex digits; the object is spent after either.
  std::array<unsigned char, 32> digest();
  std::string hexDigest();

 private:
  void compress(const unsigned char* block);

  std::array<uint32_t, 8> h_;
  std::array<unsigned char, 64> block_{};
  size_t used_ = 0;     // bytes in block_
  uint64_t total_ = 0;  // bytes hashed
};

}  // namespace cxxlaunch
