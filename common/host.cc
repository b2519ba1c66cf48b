#include "common/host.h"

#include <unistd.h>

#include <charconv>

namespace cxxlaunch {

std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

std::optional<HostPort> parseHostPort(std::string_view text, int default_port) {
  std::string_view host = text, port;
  if (!text.empty() && text.front() == '[') {  // [ipv6] or [ipv6]:port
    const auto close = text.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') return std::nullopt;
      port = text.substr(close + 2);
      if (port.empty()) return std::nullopt;
    }
  } else if (const auto colon = text.rfind(':'); colon != std::string_view::npos) {
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (port.empty()) return std::nullopt;
  }
  if (host.empty()) return std::nullopt;
  HostPort result{std::string(host), default_port};
  if (!port.empty()) {
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), result.port);
    if (ec != std::errc() || end != port.data() + port.size()) return std::nullopt;
  }
  if (result.port < 1 || result.port > 65535) return std::nullopt;
  return result;
}

std::string formatHostPort(const std::string& host, const std::string& port) {
  const bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + port;
}

std::string formatHostPort(const std::string& host, int port) {
  return formatHostPort(host, std::to_string(port));
}

}  // namespace cxxlaunch
