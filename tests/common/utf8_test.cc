// common/utf8.h: what is well-formed UTF-8, and invalid bytes written as Python's
// backslashreplace writes them.

#include "common/utf8.h"

#include <catch2/catch.hpp>
#include <string>

using namespace cxxlaunch;

TEST_CASE("Well-formed UTF-8 is recognised, malformed sequences are not", "[common][utf8]") {
  CHECK(isValidUtf8(""));
  CHECK(isValidUtf8("plain ascii"));
  CHECK(isValidUtf8("\xc3\xa9t\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80"));  // é, 中, 😀
  CHECK(isValidUtf8("\xf4\x8f\xbf\xbf"));                                 // U+10FFFF
  CHECK_FALSE(isValidUtf8("x\xff"));
  CHECK_FALSE(isValidUtf8("\xc0\xaf"));          // overlong '/'
  CHECK_FALSE(isValidUtf8("\xe0\x80\xaf"));      // overlong, three bytes
  CHECK_FALSE(isValidUtf8("\xed\xa0\x80"));      // a surrogate, U+D800
  CHECK_FALSE(isValidUtf8("\xf4\x90\x80\x80"));  // past U+10FFFF
  CHECK_FALSE(isValidUtf8("\xe4\xb8"));          // cut short
  CHECK_FALSE(isValidUtf8("\x80"));              // a lone continuation byte
}

TEST_CASE(
    "Invalid bytes become backslash-x and two hex digits as Python's backslashreplace writes them",
    "[common][utf8]") {
  CHECK(backslashReplaceInvalidUtf8("x\xff") == "x\\xff");
  CHECK(backslashReplaceInvalidUtf8("\xc3\xa9\xc3") == "\xc3\xa9\\xc3");
  CHECK(backslashReplaceInvalidUtf8("a\xe4\xb8"
                                    "b") == "a\\xe4\\xb8b");
  CHECK(backslashReplaceInvalidUtf8("\xed\xa0\x80") == "\\xed\\xa0\\x80");
  const std::string valid = "\xf0\x9f\x98\x80 ok";
  CHECK(backslashReplaceInvalidUtf8(valid) == valid);
  CHECK(isValidUtf8(backslashReplaceInvalidUtf8("\xff\xfe\x80 \xc0\xaf")));
}
