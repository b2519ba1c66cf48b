#pragma once
// Reading the small files a user names (config, token, TLS certificates) without trusting the
// name: a directory, a FIFO, a device such as /dev/zero or a file of gigabytes is refused before
// anything is read, with a message naming the path, instead of hanging or exhausting memory.

#include <cstddef>
#include <string>

namespace cxxlaunch {

// The whole contents of the regular file `path`. `what` names it for the message ("config file",
// "token file"). Throws InvalidArgument when it cannot be opened, is not a regular file, or holds
// more than `max_bytes`. Opening never blocks (a FIFO with no writer is refused, not waited on).
std::string readRegularFile(const std::string& path, const std::string& what, size_t max_bytes);

// A job token: the first line of the file `path` (at most 64 KiB, read as above). `what` names
// where the path came from ("--token-file"). Throws InvalidArgument when the file cannot be read
// or its first line is empty.
std::string readTokenFile(const std::string& path, const std::string& what);

}  // namespace cxxlaunch
