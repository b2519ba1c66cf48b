#include "text/jinja_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "text/unicode.h"

namespace cxxlaunch::text::jinja {

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Dict::set(const std::string& key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(key, std::move(value));
}

Value Value::none() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind = Kind::kBool;
  v.b = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind = Kind::kInt;
  v.i = i;
  return v;
}
Value Value::real(double f) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = f;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind = Kind::kString;
  v.s = std::move(s);
  return v;
}
Value Value::makeList(List items) {
  Value v;
  v.kind = Kind::kList;
  v.list = std::make_shared<List>(std::move(items));
  return v;
}
Value Value::makeDict(Dict d) {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::make_shared<Dict>(std::move(d));
  return v;
}
Value Value::makeNamespace(Dict d) {
  Value v = makeDict(std::move(d));
  v.kind = Kind::kNamespace;
  return v;
}
Value Value::function(Function fn) {
  Value v;
  v.kind = Kind::kFunction;
  v.fn = std::make_shared<Function>(std::move(fn));
  return v;
}

Value Value::fromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return integer(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return real(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& e : j) items.push_back(fromJson(e));
      return makeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(it.key(), fromJson(*it));
      return makeDict(std::move(d));
    }
    default:
      throw std::invalid_argument("a JSON value of an unsupported kind");
  }
}

const Value* CallArgs::keyword(const std::string& name) const {
  for (const auto& [k, v] : keywords) {
    if (k == name) return &v;
  }
  return nullptr;
}

const Value* CallArgs::get(size_t index, const std::string& name) const {
  if (index < positional.size()) return &positional[index];
  return keyword(name);
}

std::string typeName(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      return "list";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kNamespace:
      return "Namespace";
    case Value::Kind::kFunction:
      return "function";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.b;
    case Value::Kind::kInt:
      return v.i != 0;
    case Value::Kind::kFloat:
      return v.f != 0;
    case Value::Kind::kString:
      return !v.s.empty();
    case Value::Kind::kList:
      return !v.list->empty();
    case Value::Kind::kDict:
      return !v.dict->items.empty();
    case Value::Kind::kNamespace:
    case Value::Kind::kFunction:
      return true;
  }
  return false;
}

std::string pythonFloat(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[40];
  int precision = 1;
  for (; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*e", precision - 1, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  // buf is d.ddde[+-]XX with the shortest round-tripping digits; lay it out as repr() does.
  std::string s(buf);
  const size_t e = s.find('e');
  std::string mantissa = s.substr(0, e);
  const int exponent = std::atoi(s.c_str() + e + 1);
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exponent < -4 || exponent >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp;
  } else if (exponent < 0) {
    out = "0." + std::string(-exponent - 1, '0') + digits;
  } else {
    if (digits.size() <= static_cast<size_t>(exponent) + 1) {
      out = digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
  }
  return negative ? "-" + out : out;
}

namespace {

std::string reprString(const std::string& s) {
  const bool use_double = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char quote = use_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == quote) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

void jsonString(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (size_t k = 0; k < s.size(); ++k) {
    const unsigned char c = static_cast<unsigned char>(s[k]);
    if (ensure_ascii && c >= 0x80) {
      size_t next = k;
      char32_t cp = nextCodePoint(s, next);
      k = next - 1;
      char buf[16];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (cp >> 10),
                      0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
      }
      out += buf;
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void jsonValue(const Value& v, const JsonOptions& o, int level, std::string& out) {
  const std::string item_sep = !o.item_separator.empty() ? o.item_separator
                               : o.indent >= 0           ? ","
                                                         : ", ";
  const std::string key_sep = !o.key_separator.empty() ? o.key_separator : ": ";
  auto newline = [&](int depth) {
    if (o.indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(o.indent * depth), ' ');
  };
  switch (v.kind) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.b ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.i);
      return;
    case Value::Kind::kFloat:
      if (std::isnan(v.f))
        out += "NaN";
      else if (std::isinf(v.f))
        out += v.f < 0 ? "-Infinity" : "Infinity";
      else
        out += pythonFloat(v.f);
      return;
    case Value::Kind::kString:
      jsonString(v.s, o.ensure_ascii, out);
      return;
    case Value::Kind::kList: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k > 0) out += item_sep;
        newline(level + 1);
        jsonValue((*v.list)[k], o, level + 1, out);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : v.dict->items) items.push_back(&item);
      if (o.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k > 0) out += item_sep;
        newline(level + 1);
        jsonString(items[k]->first, o.ensure_ascii, out);
        out += key_sep;
        jsonValue(items[k]->second, o, level + 1, out);
      }
      newline(level);
      out += '}';
      return;
    }
    default:
      throw std::invalid_argument("Object of type " + typeName(v) + " is not JSON serializable");
  }
}

}  // namespace

std::string toRepr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kString:
      return reprString(v.s);
    case Value::Kind::kList: {
      std::string out = "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k > 0) out += ", ";
        out += toRepr((*v.list)[k]);
      }
      return out + "]";
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      for (size_t k = 0; k < v.dict->items.size(); ++k) {
        if (k > 0) out += ", ";
        out += reprString(v.dict->items[k].first) + ": " + toRepr(v.dict->items[k].second);
      }
      return out + "}";
    }
    default:
      return toStr(v);
  }
}

std::string toStr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.b ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.i);
    case Value::Kind::kFloat:
      return pythonFloat(v.f);
    case Value::Kind::kString:
      return v.s;
    case Value::Kind::kNamespace:
      return "<Namespace>";
    case Value::Kind::kFunction:
      return "<function>";
    default:
      return toRepr(v);
  }
}

double toDouble(const Value& v) {
  if (v.kind == Value::Kind::kFloat) return v.f;
  if (v.kind == Value::Kind::kBool) return v.b ? 1 : 0;
  return static_cast<double>(v.i);
}

bool equals(const Value& a, const Value& b) {
  if (a.isNumber() && b.isNumber()) {
    if (a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat) {
      return (a.kind == Value::Kind::kBool ? a.b : a.i) ==
             (b.kind == Value::Kind::kBool ? b.b : b.i);
    }
    return toDouble(a) == toDouble(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.s == b.s;
    case Value::Kind::kList: {
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [key, value] : a.dict->items) {
        const Value* other = b.dict->find(key);
        if (other == nullptr || !equals(value, *other)) return false;
      }
      return true;
    }
    default:
      return a.dict == b.dict && a.fn == b.fn;
  }
}

int compare(const Value& a, const Value& b) {
  if (a.isNumber() && b.isNumber()) {
    if (a.kind == Value::Kind::kInt && b.kind == Value::Kind::kInt) {
      return a.i < b.i ? -1 : a.i > b.i ? 1 : 0;
    }
    const double x = toDouble(a), y = toDouble(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.isString() && b.isString()) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
  if (a.isList() && b.isList()) {
    for (size_t k = 0; k < std::min(a.list->size(), b.list->size()); ++k) {
      const int c = compare((*a.list)[k], (*b.list)[k]);
      if (c != 0) return c;
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  throw std::invalid_argument("'<' not supported between instances of '" + typeName(a) + "' and '" +
                              typeName(b) + "'");
}

std::string toJson(const Value& v, const JsonOptions& options) {
  std::string out;
  jsonValue(v, options, 0, out);
  return out;
}

std::vector<std::string> codePoints(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    const size_t start = i;
    nextCodePoint(s, i);
    out.push_back(s.substr(start, i - start));
  }
  return out;
}

}  // namespace cxxlaunch::text::jinja
