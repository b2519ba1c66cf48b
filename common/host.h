#pragma once
// This machine's name and the `host:port` text every module reads and writes (flags, config,
// the store endpoint, log lines). An IPv6 address is written in brackets, "[::1]:29400", so that
// the last ':' always starts the port.

#include <optional>
#include <string>
#include <string_view>

namespace cxxlaunch {

// gethostname(), or "localhost" when the system cannot tell.
std::string hostName();

// The network interface that holds `address` (IPv4 or IPv6 text), e.g. "eth0" for 10.0.0.2 or
// "lo" for 127.0.0.1; "" when no interface of this machine (network namespace) holds it.
std::string interfaceHolding(const std::string& address);

// Whether `address` (IPv4 or IPv6 text) is a loopback address: 127.0.0.0/8 or ::1.
bool isLoopbackAddress(const std::string& address);

// The first IPv4 address of an interface that is up and not loopback, in the order the system
// lists them; "" when there is none.
std::string firstNonLoopbackAddress();

struct HostPort {
  std::string host;  // without brackets
  int port = 0;
};

// Parses "HOST", "HOST:PORT", "[IPV6]" or "[IPV6]:PORT"; without a port, `default_port`.
// nullopt when the text has no host, an unclosed bracket, or a port that is not 1-65535.
std::optional<HostPort> parseHostPort(std::string_view text, int default_port);

// "host:port", with brackets around a host that holds a ':' (IPv6). `port` is text so that a
// value still to be checked (a config file's) can be formatted and then parsed.
std::string formatHostPort(const std::string& host, const std::string& port);
std::string formatHostPort(const std::string& host, int port);

}  // namespace cxxlaunch
