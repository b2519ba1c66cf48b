// common/sha256.h against FIPS 180-4's test vectors: the empty string, one block, two blocks,
// and a million bytes; the raw digest is the hex one's bytes.

#include "common/sha256.h"

#include <catch2/catch.hpp>
#include <string>

TEST_CASE("SHA-256 of the known vectors", "[common][sha256]") {
  auto digest = [](const std::string& text) {
    cxxlaunch::Sha256 hash;
    hash.update(text);
    return hash.hexDigest();
  };
  CHECK(digest("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(digest("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(digest("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(digest(std::string(1000000, 'a')) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("SHA-256's raw digest is the bytes of the hex one", "[common][sha256]") {
  cxxlaunch::Sha256 raw, hex;
  raw.update("abc");
  hex.update("abc");
  const auto bytes = raw.digest();
  std::string spelled;
  for (const unsigned char b : bytes) {
    spelled += "0123456789abcdef"[b >> 4];
    spelled += "0123456789abcdef"[b & 15];
  }
  CHECK(spelled == hex.hexDigest());
}
