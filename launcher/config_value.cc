// Value parsing: a key's text checked against its type and range and put in canonical form, and
// the words messages use for each type.

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "launcher/config.h"
#include "launcher/config_internal.h"

namespace cxxlaunch::launcher {

using namespace config_detail;  // NOLINT(google-build-using-namespace)

namespace {

// Printable UTF-8: what a host name, a path or a class name can be, and what the writer can
// write back unchanged.
bool printableUtf8(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f) return false;
      ++i;
      continue;
    }
    const size_t n = c >= 0xf0 && c < 0xf5 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
    if (n == 0 || i + n > text.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(text[i + k]) & 0xc0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

// Parses `text` as `spec`'s type; returns the canonical text or "" with `why` set.
std::string canonical(const KeySpec& spec, const std::string& text, std::string& why) {
  switch (spec.type) {
    case KeyType::kBool: {
      const std::string t = lower(text);
      if (t == "true" || t == "yes" || t == "on" || t == "y" || t == "1") return "true";
      if (t == "false" || t == "no" || t == "off" || t == "n" || t == "0") return "false";
      break;
    }
    case KeyType::kInt: {
      // YAML writes big counts as 1e8 too; accept whole numbers in any notation.
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) ||
          v != std::floor(v)) {
        break;
      }
      if (v < spec.min || v > spec.max) {
        why = formatNumber(v) + " is out of range; use " + kindName(spec);
        return "";
      }
      return std::to_string(static_cast<long long>(v));
    }
    case KeyType::kNumber:
    case KeyType::kSeconds: {
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v)) break;
      if (v < spec.min || v > spec.max) {
        why = text + " is out of range; use " + kindName(spec);
        return "";
      }
      return formatNumber(v);
    }
    case KeyType::kChoice: {
      std::string t = text;
      if (spec.key == "fsdp_config.fsdp_sharding_strategy" && t.size() == 1 && t[0] >= '1' &&
          t[0] <= '5') {
        return kShardingStrategies[static_cast<size_t>(t[0] - '1')];
      }
      for (const auto& choice : spec.choices) {
        if (lower(choice) == lower(t)) return choice;
      }
      if (spec.key == "distributed_type") {
        why = "'" + text + "' is not supported by cxxlaunch; use " + kindName(spec);
        return "";
      }
      break;
    }
    case KeyType::kGpuIds: {
      if (lower(text) == "all") return "all";
      std::string out;
      std::istringstream in(text);
      std::string item;
      int count = 0;
      while (std::getline(in, item, ',')) {
        item.erase(0, item.find_first_not_of(' '));
        item.erase(item.find_last_not_of(' ') + 1);
        int id = -1;
        auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), id);
        if (ec != std::errc() || ptr != item.data() + item.size() || id < 0 || id > 4096) {
          count = -1;
          break;
        }
        out += (count++ == 0 ? "" : ",") + std::to_string(id);
      }
      if (count > 0 && !text.empty() && text.back() != ',') return out;
      break;
    }
    case KeyType::kText:
      if (printableUtf8(text)) return text;
      why = "the value has control characters or is not valid UTF-8";
      return "";
  }
  why = "'" + text + "' is not " + kindName(spec);
  return "";
}

}  // namespace

std::string config_detail::lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

std::string config_detail::formatNumber(double v) {
  std::ostringstream out;
  out.precision(15);
  out << v;
  return out.str();
}

std::string config_detail::kindName(const KeySpec& spec) {
  switch (spec.type) {
    case KeyType::kBool:
      return "true or false";
    case KeyType::kInt:
      return "a whole number from " + formatNumber(spec.min) + " to " + formatNumber(spec.max);
    case KeyType::kNumber:
      return "a number from " + formatNumber(spec.min) + " to " + formatNumber(spec.max);
    case KeyType::kSeconds:
      return "a number of seconds " + std::string(spec.min > 0 ? "> 0" : ">= 0") +
             " and <= " + formatNumber(spec.max);
    case KeyType::kChoice: {
      std::string list;
      for (size_t i = 0; i < spec.choices.size(); ++i) {
        list += (i == 0 ? "" : i + 1 == spec.choices.size() ? " or " : ", ") + spec.choices[i];
      }
      return "one of " + list;
    }
    case KeyType::kGpuIds:
      return "all or a comma-separated list of GPU ids, e.g. 0,1";
    case KeyType::kText:
      break;
  }
  return "text";
}

bool parseValue(const KeySpec& spec, const std::string& text, std::string& value,
                std::string& why) {
  why.clear();
  value = canonical(spec, text, why);
  return why.empty();
}

}  // namespace cxxlaunch::launcher
