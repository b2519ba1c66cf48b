#include "launcher/hostlist.h"

#include <cctype>

#include "common/error.h"

namespace cxxlaunch::launcher {
namespace {

[[noreturn]] void malformed(const std::string& list, const std::string& why) {
  throw InvalidArgument("malformed Slurm hostlist '" + list + "': " + why);
}

bool allDigits(const std::string& text) {
  if (text.empty() || text.size() > 18) return false;
  for (unsigned char c : text) {
    if (!std::isdigit(c)) return false;
  }
  return true;
}

// One bracket group's contents ("01-04,07") as the texts it stands for.
std::vector<std::string> expandGroup(const std::string& list, const std::string& group) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = group.find(',', start);
    const std::string part =
        group.substr(start, comma == std::string::npos ? comma : comma - start);
    const size_t dash = part.find('-');
    const std::string lo = part.substr(0, dash);
    const std::string hi = dash == std::string::npos ? lo : part.substr(dash + 1);
    if (!allDigits(lo) || !allDigits(hi)) {
      malformed(list, "'[" + group + "]' holds '" + part + "', not a number or a range N-M");
    }
    const long long first = std::stoll(lo), last = std::stoll(hi);
    if (last < first) malformed(list, "the range '" + part + "' ends below its start");
    if (last - first >= static_cast<long long>(kMaxHostlistHosts)) {
      malformed(list, "the range '" + part + "' names more than " +
                          std::to_string(kMaxHostlistHosts) + " hosts");
    }
    for (long long n = first; n <= last; ++n) {
      std::string digits = std::to_string(n);
      if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');
      out.push_back(std::move(digits));
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// One host expression ("rack[1-2]-n[01-03]"): the product of its bracket groups, in order.
void expandExpression(const std::string& list, const std::string& expr,
                      std::vector<std::string>& hosts) {
  if (expr.empty()) malformed(list, "an empty host name");
  std::vector<std::string> names = {""};
  size_t at = 0;
  while (at < expr.size()) {
    const size_t open = expr.find('[', at);
    const std::string literal = expr.substr(at, open == std::string::npos ? open : open - at);
    if (literal.find(']') != std::string::npos) malformed(list, "a ']' without its '['");
    for (auto& name : names) name += literal;
    if (open == std::string::npos) break;
    const size_t close = expr.find(']', open);
    if (close == std::string::npos) malformed(list, "a '[' without its ']'");
    const std::string group = expr.substr(open + 1, close - open - 1);
    if (group.find('[') != std::string::npos) malformed(list, "brackets inside brackets");
    const std::vector<std::string> parts = expandGroup(list, group);
    if (names.size() * parts.size() + hosts.size() > kMaxHostlistHosts) {
      malformed(list, "it names more than " + std::to_string(kMaxHostlistHosts) + " hosts");
    }
    std::vector<std::string> product;
    product.reserve(names.size() * parts.size());
    for (const auto& name : names) {
      for (const auto& part : parts) product.push_back(name + part);
    }
    names = std::move(product);
    at = close + 1;
  }
  for (auto& name : names) {
    for (unsigned char c : name) {
      if (std::isspace(c) || std::iscntrl(c)) malformed(list, "a space or control character");
    }
    hosts.push_back(std::move(name));
  }
}

}  // namespace

std::vector<std::string> expandHostlist(const std::string& list) {
  if (list.empty()) malformed(list, "it is empty");
  std::vector<std::string> hosts;
  // Commas inside brackets belong to the group; only those outside separate expressions.
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) malformed(list, "a ']' without its '['");
    if (c == ',' && depth == 0) {
      expandExpression(list, list.substr(start, i - start), hosts);
      start = i + 1;
    }
  }
  if (depth != 0) malformed(list, "a '[' without its ']'");
  return hosts;
}

}  // namespace cxxlaunch::launcher
