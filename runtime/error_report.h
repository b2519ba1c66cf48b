#pragma once
// What becomes of an error a trainer does not catch, as torchrun's @record does for a Python
// trainer: instead of std::terminate's abort (a SIGABRT and a core, the message lost among the
// stderr lines), one line `error: <what>` on stderr, the message in TORCHELASTIC_ERROR_FILE (the
// launcher's failure table shows it; LibTorch's errors without their C++ stack trace), and an
// ordinary exit code: 2 for an InvalidArgument (the trainer's own mistake, as the launcher's
// usage errors), 1 for any other error. Anything that is not a std::exception, or a terminate
// without an exception, goes to the handler there was.
//
// Thread-safety: installUncaughtErrorReport may be called from any thread, any number of times;
// the first call installs the handler for the whole process.

#include <string>

namespace cxxlaunch::runtime {

// `error_file`: where the launcher reads a worker's error (empty: none).
void installUncaughtErrorReport(const std::string& error_file);

// From now on an uncaught error whose message contains `pattern` (one of LibTorch's, which says
// nothing of cxxlaunch) is reported with `hint` after it: what it means here and what to do.
void addUncaughtErrorHint(const std::string& pattern, const std::string& hint);

// The exit code an uncaught `error` ends the process with (see above).
int exitCodeOf(const std::exception& error);

// The error file's JSON for `message`, as torchrun's workers write it.
std::string errorFileJson(const std::string& message);

}  // namespace cxxlaunch::runtime
