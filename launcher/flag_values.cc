#include "launcher/flag_values.h"

#include <charconv>
#include <cstdlib>
#include <sstream>
#include <string_view>

#include "common/did_you_mean.h"
#include "common/file.h"
#include "common/host.h"
#include "launcher/cli.h"
#include "rendezvous/etcd_store.h"
#include "rendezvous/run_state.h"

namespace cxxlaunch::launcher {
namespace {

constexpr double kRendezvousSeconds =
    std::chrono::duration<double>(rendezvous::kMaxSettingTime).count();

bool parseIntText(std::string_view text, long long& out) {
  if (text.empty()) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

}  // namespace

void failFlag(const std::string& flag, const std::string& value, const std::string& want) {
  throw UsageError("--" + flag + ": '" + value + "' is not " + want);
}

int parseInt(const std::string& flag, const std::string& value, long long lo, long long hi,
             const std::string& want) {
  long long v = 0;
  if (!parseIntText(value, v) || v < lo) failFlag(flag, value, want);
  // A number past the top: `want` if it names the top, else the range.
  if (v > hi) {
    const std::string top = std::to_string(hi);
    failFlag(flag, value,
             want.find(top) != std::string::npos
                 ? want
                 : "a number from " + std::to_string(lo) + " to " + top);
  }
  return static_cast<int>(v);
}

std::chrono::milliseconds parseSeconds(const std::string& flag, const std::string& value,
                                       bool allow_zero, double max_seconds) {
  char* end = nullptr;
  double seconds = std::strtod(value.c_str(), &end);
  if (value.empty() || end != value.c_str() + value.size() || !(seconds >= 0) ||
      (!allow_zero && seconds == 0) || seconds > max_seconds) {
    failFlag(flag, value,
             std::string(allow_zero ? "a number of seconds >= 0" : "a number of seconds > 0") +
                 " and <= " + std::to_string(static_cast<long long>(max_seconds)));
  }
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, sep)) parts.push_back(part);
  if (!text.empty() && text.back() == sep) parts.emplace_back();
  return parts;
}

std::vector<int> parseIntList(const std::string& flag, const std::string& value) {
  std::vector<int> list;
  for (const auto& item : split(value, ',')) {
    list.push_back(parseInt(flag, item, 0, 1 << 20, "a comma-separated list of numbers, e.g. 0,2"));
  }
  if (list.empty()) failFlag(flag, value, "a comma-separated list of numbers, e.g. 0,2");
  return list;
}

StreamSpec parseStreamSpec(const std::string& flag, const std::string& value) {
  const std::string want = "0-3 or a per-local-rank map such as 0:3,1:1";
  StreamSpec spec;
  if (value.find(':') == std::string::npos) {
    spec.all = parseInt(flag, value, 0, 3, want);
    return spec;
  }
  for (const auto& item : split(value, ',')) {
    auto colon = item.find(':');
    if (colon == std::string::npos) failFlag(flag, value, want);
    int rank = parseInt(flag, item.substr(0, colon), 0, 1 << 20, want);
    spec.per_rank[rank] = parseInt(flag, item.substr(colon + 1), 0, 3, want);
  }
  return spec;
}

void parseNnodes(RendezvousOptions& r, const std::string& flag, const std::string& value) {
  const std::string want = "a number of nodes >= 1, or MIN:MAX with 1 <= MIN <= MAX";
  auto colon = value.find(':');
  if (colon == std::string::npos) {
    r.min_nodes = r.max_nodes = parseInt(flag, value, 1, 65536, want);
    return;
  }
  r.min_nodes = parseInt(flag, value.substr(0, colon), 1, 65536, want);
  r.max_nodes = parseInt(flag, value.substr(colon + 1), 1, 65536, want);
  if (r.min_nodes > r.max_nodes) failFlag(flag, value, want);
}

std::string parseEndpoint(const std::string& flag, const std::string& value) {
  const auto parsed = parseHostPort(value, 29400);  // torchrun's c10d default port
  if (!parsed) failFlag(flag, value, "HOST or HOST:PORT with a port 1-65535");
  return formatHostPort(parsed->host, parsed->port);
}

void parseRdzvEndpoint(RendezvousOptions& r, const std::string& flag, const std::string& value) {
  r.etcd_endpoints = value;
  // etcd's client URLs (http://h:p, https://h:p) name members too.
  auto bare = [](std::string member) {
    for (const std::string scheme : {"http://", "https://"}) {
      if (member.starts_with(scheme)) return member.substr(scheme.size());
    }
    return member;
  };
  if (value.find(',') != std::string::npos) {
    // A list only makes sense for etcd; which backend is checked once every flag is read.
    for (const auto& member : split(value, ',')) (void)parseEndpoint(flag, bare(member));
    r.endpoint = value;
    return;
  }
  r.endpoint = parseEndpoint(flag, bare(value));
}

std::string readTokenFile(const std::string& path) {
  try {
    return cxxlaunch::readTokenFile(path, "--rdzv_conf token_file");
  } catch (const InvalidArgument& e) {
    throw UsageError(e.what());
  }
}

void parseRdzvConf(RendezvousOptions& r, const std::string& flag, const std::string& value) {
  for (const auto& item : split(value, ',')) {
    auto eq = item.find('=');
    if (eq == std::string::npos) failFlag(flag, value, "a list of KEY=VALUE separated by commas");
    const std::string key = item.substr(0, eq), v = item.substr(eq + 1);
    const std::string name = flag + " " + key;
    if (key == "join_timeout" || key == "timeout") {
      r.join_timeout = parseSeconds(name, v, false);
    } else if (key == "last_call_timeout") {
      r.last_call_timeout = parseSeconds(name, v, true, kRendezvousSeconds);
    } else if (key == "close_timeout") {
      r.close_timeout = parseSeconds(name, v, true);
    } else if (key == "keep_alive_interval") {
      r.keep_alive_interval = parseSeconds(name, v, false, kRendezvousSeconds);
    } else if (key == "keep_alive_max_misses") {
      r.keep_alive_max_misses = parseInt(name, v, 1, 1000, "a number >= 1");
    } else if (key == "is_host") {
      if (v != "true" && v != "false" && v != "1" && v != "0") failFlag(name, v, "true or false");
      r.is_host = v == "true" || v == "1";
    } else if (key == "token_file") {
      r.token = readTokenFile(v);
    } else if (key == "tls_ca" || key == "cacert") {
      r.tls_ca = v;
    } else if (key == "tls_cert" || key == "cert") {
      r.tls_cert = v;
    } else if (key == "tls_key" || key == "key") {
      r.tls_key = v;
    } else if (key == "user") {
      if (v.empty()) failFlag(name, v, "an etcd user name");
      r.etcd_user = v;
    } else if (key == "password") {
      r.etcd_password = v;
    } else if (key == "password_file") {
      try {
        r.etcd_password = cxxlaunch::readTokenFile(v, "--rdzv_conf password_file");
      } catch (const InvalidArgument& e) {
        throw UsageError(e.what());
      }
    } else if (key == "etcd_prefix") {  // torchrun's etcd backend's key
      try {
        r.etcd_root = rendezvous::etcdRoot(v);
      } catch (const InvalidArgument& e) {
        throw UsageError("--" + flag + " etcd_prefix: " + e.what());
      }
    } else if (key == "protocol") {
      // torchrun's etcd backend: http or https; TLS here is on when tls_ca (cacert) is given.
      if (v != "http" && v != "https") failFlag(name, v, "http or https");
    } else {
      const std::string best =
          closestMatch(key, {"join_timeout", "last_call_timeout", "close_timeout",
                             "keep_alive_interval", "keep_alive_max_misses", "is_host",
                             "token_file", "tls_ca", "tls_cert", "tls_key", "user", "password",
                             "password_file", "cacert", "cert", "key", "protocol", "etcd_prefix"});
      throw UsageError("--" + flag + ": unknown key '" + key + "'" +
                       (best.empty() ? "" : "; did you mean " + best + "?"));
    }
  }
}

}  // namespace cxxlaunch::launcher
