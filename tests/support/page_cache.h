#pragma once
// Test helpers for I/O that goes past the page cache (O_DIRECT): whether a folder's file system
// takes it, and how much of a file the page cache holds.

#include <cstddef>
#include <string>

namespace cxxlaunch::testing {

// Whether a file system other than tmpfs (whose files are page cache) takes an aligned O_DIRECT
// write in `folder`.
bool takesDirectIo(const std::string& folder);

// How many of the file's pages are in the page cache (mincore over a mapping of it); throws
// std::runtime_error if the file cannot be mapped.
size_t residentPages(const std::string& path);

}  // namespace cxxlaunch::testing
