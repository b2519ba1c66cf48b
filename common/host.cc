#include "common/host.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <unistd.h>

#include <charconv>
#include <cstring>

namespace cxxlaunch {

std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

namespace {

// The numeric text of an interface address, "" for families other than IPv4 and IPv6.
std::string addressText(const sockaddr* addr) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr == nullptr) return "";
  if (addr->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, text, sizeof(text));
  } else if (addr->sa_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr, text,
                sizeof(text));
  }
  return text;
}

// Calls `visit(entry)` for each interface address until it returns true.
template <typename Visit>
void forEachInterfaceAddress(Visit&& visit) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return;
  for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (visit(*a)) break;
  }
  ::freeifaddrs(list);
}

}  // namespace

std::string interfaceHolding(const std::string& address) {
  std::string found;
  forEachInterfaceAddress([&](const ifaddrs& a) {
    if (addressText(a.ifa_addr) != address) return false;
    found = a.ifa_name;
    return true;
  });
  return found;
}

bool isLoopbackAddress(const std::string& address) {
  in_addr v4{};
  if (::inet_pton(AF_INET, address.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return ::inet_pton(AF_INET6, address.c_str(), &v6) == 1 &&
         std::memcmp(&v6, &in6addr_loopback, sizeof(v6)) == 0;
}

std::string firstNonLoopbackAddress() {
  std::string found;
  forEachInterfaceAddress([&](const ifaddrs& a) {
    if (a.ifa_addr == nullptr || a.ifa_addr->sa_family != AF_INET) return false;
    if ((a.ifa_flags & IFF_UP) == 0 || (a.ifa_flags & IFF_LOOPBACK) != 0) return false;
    found = addressText(a.ifa_addr);
    return true;
  });
  return found;
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
