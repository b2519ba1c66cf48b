#include "common/error.h"

#include <cstring>

namespace cxxlaunch {

SystemError::SystemError(const std::string& call, int err)
    : Error(call + " failed: " + std::strerror(err)), code_(err) {}

}  // namespace cxxlaunch
