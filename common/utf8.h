#pragma once
// Text that must be valid UTF-8 (JSON, above all) built from bytes that need not be: a program
// argument, a path, a metric name. Invalid bytes are written as Python's `backslashreplace` error
// handler writes them (b"x\xff" -> "x\\xff"), so the byte's value survives in a form a reader can
// see and grep, and valid text passes through unchanged.

#include <string>
#include <string_view>

namespace cxxlaunch {

// True when `text` is well-formed UTF-8 (no overlong forms, no surrogates, at most U+10FFFF).
bool isValidUtf8(std::string_view text);

// `text` with each byte that is not part of a well-formed UTF-8 sequence replaced by the four
// characters `\xHH` (lower-case hex). Returns `text` unchanged when it is valid.
std::string backslashReplaceInvalidUtf8(std::string_view text);

}  // namespace cxxlaunch
