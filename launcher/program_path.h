#pragma once
// Finding the program `cxxlaunch run` starts, before anything is spawned, so that a typo is one
// clear error (exit 2) instead of N workers failing to exec.

#include <string>

namespace cxxlaunch::launcher {

// `program` as a path to an executable file: as given when it holds a '/', else the first match
// on `path` ($PATH's form, "a:b:c"). Throws UsageError saying what is wrong, with a hint for a
// Python script given without its interpreter.
std::string findProgram(const std::string& program, const std::string& path);

}  // namespace cxxlaunch::launcher
