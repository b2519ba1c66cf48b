// The value types of rendezvous/etcd_client.h (compares, operations) and its endpoint lists:
// plain data, no gRPC.

#include <algorithm>
#include <cctype>

#include "common/error.h"
#include "common/host.h"
#include "rendezvous/etcd_client.h"

namespace cxxlaunch::rendezvous {
namespace {
// etcd's client port.
constexpr int kDefaultEtcdPort = 2379;
}  // namespace

EtcdCompare EtcdCompare::valueIs(std::string key, std::string value) {
  EtcdCompare c;
  c.key = std::move(key);
  c.target = Target::kValue;
  c.value = std::move(value);
  return c;
}

EtcdCompare EtcdCompare::modIs(std::string key, int64_t revision) {
  EtcdCompare c;
  c.key = std::move(key);
  c.target = Target::kMod;
  c.number = revision;
  return c;
}

EtcdCompare EtcdCompare::missing(std::string key) {
  EtcdCompare c;
  c.key = std::move(key);
  c.target = Target::kCreate;
  c.number = 0;
  return c;
}

EtcdOp EtcdOp::get(std::string key) {
  EtcdOp op;
  op.key = std::move(key);
  return op;
}

EtcdOp EtcdOp::prefix(std::string prefix, bool count_only, bool keys_only) {
  EtcdOp op;
  op.range_end = prefixEnd(prefix);
  op.key = std::move(prefix);
  op.count_only = count_only;
  op.keys_only = keys_only;
  return op;
}

EtcdOp EtcdOp::put(std::string key, std::string value, int64_t lease) {
  EtcdOp op;
  op.kind = Kind::kPut;
  op.key = std::move(key);
  op.value = std::move(value);
  op.lease = lease;
  return op;
}

EtcdOp EtcdOp::erase(std::string key) {
  EtcdOp op;
  op.kind = Kind::kDelete;
  op.key = std::move(key);
  return op;
}

EtcdOp EtcdOp::erasePrefix(std::string prefix) {
  EtcdOp op;
  op.kind = Kind::kDelete;
  op.range_end = prefixEnd(prefix);
  op.key = std::move(prefix);
  return op;
}

std::string prefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

std::vector<std::string> parseEtcdEndpoints(const std::string& text) {
  std::string list = text;
  if (list.rfind(kEtcdScheme, 0) == 0) {  // our own URL: members, then perhaps the key root
    list = list.substr(sizeof(kEtcdScheme) - 1);
    list = list.substr(0, list.find('/'));
  }
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    std::string member = list.substr(start, comma - start);
    // etcd's own client URLs ("http://h:p") are accepted too; TLS is chosen by --rdzv_conf.
    for (const char* scheme : {"http://", "https://"}) {
      if (member.rfind(scheme, 0) == 0) member = member.substr(std::string(scheme).size());
    }
    const auto parsed = parseHostPort(member, kDefaultEtcdPort);
    if (member.empty() || !parsed) {
      throw InvalidArgument("etcd endpoint '" + member + "' in '" + text +
                            "' is not HOST[:PORT] (a list: HOST:PORT,HOST:PORT,...)");
    }
    out.push_back(formatHostPort(parsed->host, parsed->port));
    start = comma + 1;
  }
  return out;
}

std::string etcdEndpointUrl(const std::vector<std::string>& endpoints, const std::string& root) {
  std::string url = kEtcdScheme;
  for (size_t i = 0; i < endpoints.size(); ++i) url += (i ? "," : "") + endpoints[i];
  return url + root;
}

}  // namespace cxxlaunch::rendezvous
