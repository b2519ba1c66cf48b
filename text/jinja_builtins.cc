#include "text/jinja_builtins.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "text/unicode.h"

namespace cxxlaunch::text::jinja {

namespace {

const std::set<std::string>& filters() {
  static const std::set<std::string> k = {
      "abs",        "capitalize", "count",      "d",       "default", "first",  "float",
      "int",        "items",      "join",       "last",    "length",  "list",   "lower",
      "map",        "reject",     "rejectattr", "replace", "reverse", "safe",   "select",
      "selectattr", "string",     "title",      "tojson",  "trim",    "unique", "upper"};
  return k;
}

const std::set<std::string>& tests() {
  static const std::set<std::string> k = {
      "boolean", "callable", "defined",   "divisibleby", "eq",     "equalto",
      "even",    "false",    "float",     "ge",          "gt",     "in",
      "integer", "iterable", "le",        "lower",       "lt",     "mapping",
      "ne",      "none",     "number",    "odd",         "sameas", "sequence",
      "string",  "true",     "undefined", "upper",       "=="};
  return k;
}

}  // namespace

bool isPySpace(char32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
         c == 0x3000;
}

const Value& need(const CallArgs& args, size_t index, const std::string& name,
                  const std::string& what) {
  const Value* v = args.get(index, name);
  if (v == nullptr) throw TemplateError(what + " needs the argument '" + name + "'");
  return *v;
}

const std::string& needString(const Value& v, const std::string& what) {
  if (!v.isString()) throw TemplateError(what + " expects a string, not " + typeName(v));
  return v.s;
}

std::string mapCase(const std::string& s, int mode /* 0 lower, 1 upper, 2 title */) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const char32_t c = nextCodePoint(s, i);
    const UChar32 m = mode == 0   ? u_tolower(static_cast<UChar32>(c))
                      : mode == 1 ? u_toupper(static_cast<UChar32>(c))
                                  : u_totitle(static_cast<UChar32>(c));
    appendUtf8(out, static_cast<char32_t>(m));
  }
  return out;
}

std::string replaceAll(const std::string& s, const std::string& from, const std::string& to,
                       int64_t count) {
  if (from.empty()) {  // Python puts `to` between every character and at both ends
    std::string out;
    int64_t done = 0;
    for (const auto& cp : codePoints(s)) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      out += cp;
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  std::string out;
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out += s.substr(pos, hit - pos) + to;
    pos = hit + from.size();
    ++done;
  }
  return out + s.substr(pos);
}

List iterate(const Value& v, const std::string& what) {
  switch (v.kind) {
    case Value::Kind::kList:
      return *v.list;
    case Value::Kind::kDict: {
      List keys;
      for (const auto& [k, _] : v.dict->items) keys.push_back(Value::string(k));
      return keys;
    }
    case Value::Kind::kString: {
      List chars;
      for (auto& cp : codePoints(v.s)) chars.push_back(Value::string(std::move(cp)));
      return chars;
    }
    case Value::Kind::kUndefined:
      return {};
    default:
      throw TemplateError(what + ": '" + typeName(v) + "' object is not iterable");
  }
}

namespace {

// Jinja2's attribute lookup for selectattr/map: "a.b" walks dicts.
Value attributeOf(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = std::min(path.find('.', start), path.size());
    const std::string key = path.substr(start, dot - start);
    const Value* found = cur.dict ? cur.dict->find(key) : nullptr;
    if (found == nullptr) return Value();
    cur = *found;
    start = dot + 1;
  }
  return cur;
}

Value selectFilter(const std::string& name, const Value& operand, const CallArgs& args) {
  const bool by_attr = name == "selectattr" || name == "rejectattr";
  const bool keep = name == "select" || name == "selectattr";
  CallArgs rest;
  size_t first = 0;
  std::string attr;
  if (by_attr) attr = needString(need(args, first++, "attribute", name), name);
  std::string test;
  if (first < args.positional.size()) test = needString(args.positional[first++], name);
  if (!test.empty() && !isSupportedTest(test))
    throw TemplateError("test '" + test + "' is not supported");
  for (size_t k = first; k < args.positional.size(); ++k)
    rest.positional.push_back(args.positional[k]);
  List out;
  for (const Value& item : iterate(operand, name)) {
    const Value subject = by_attr ? attributeOf(item, attr) : item;
    const bool pass = test.empty() ? truthy(subject) : applyTest(test, subject, rest);
    if (pass == keep) out.push_back(item);
  }
  return Value::makeList(std::move(out));
}

Value mapFilter(const Value& operand, const CallArgs& args) {
  List out;
  if (const Value* attr = args.keyword("attribute")) {
    const Value* fallback = args.keyword("default");
    for (const Value& item : iterate(operand, "map")) {
      Value v = attributeOf(item, needString(*attr, "map"));
      out.push_back(v.isUndefined() && fallback ? *fallback : v);
    }
    return Value::makeList(std::move(out));
  }
  const std::string& filter = needString(need(args, 0, "filter", "map"), "map");
  if (!isSupportedFilter(filter)) throw TemplateError("filter '" + filter + "' is not supported");
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keywords = args.keywords;
  for (const Value& item : iterate(operand, "map")) out.push_back(applyFilter(filter, item, rest));
  return Value::makeList(std::move(out));
}

}  // namespace

int64_t toInt(const Value& v, int64_t fallback) {
  switch (v.kind) {
    case Value::Kind::kInt:
      return v.i;
    case Value::Kind::kBool:
      return v.b;
    case Value::Kind::kFloat:
      return static_cast<int64_t>(v.f);
    case Value::Kind::kString: {
      try {
        size_t used = 0;
        const std::string t = pyStrip(v.s, nullptr, true, true);
        const int64_t n = std::stoll(t, &used, 10);
        if (used == t.size()) return n;
        return static_cast<int64_t>(std::stod(t));
      } catch (const std::exception&) {
        return fallback;
      }
    }
    default:
      return fallback;
  }
}

namespace {

std::string titleCase(const std::string& s) {
  // Jinja2's title filter: each run after one of "-", whitespace, "(", "{", "[", "<" starts a word,
  // its first character upper case and the rest lower case.
  std::string out;
  bool word_start = true;
  size_t i = 0;
  while (i < s.size()) {
    const size_t at = i;
    const char32_t c = nextCodePoint(s, i);
    const bool boundary = isPySpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (boundary) {
      out += s.substr(at, i - at);
      word_start = true;
    } else {
      out += mapCase(s.substr(at, i - at), word_start ? 1 : 0);
      word_start = false;
    }
  }
  return out;
}

}  // namespace

std::string pyStrip(const std::string& s, const Value* chars, bool left, bool right) {
  std::vector<std::string> cps = codePoints(s);
  std::set<std::string> set;
  const bool whitespace = chars == nullptr || chars->kind == Value::Kind::kNone;
  if (!whitespace) {
    for (auto& cp : codePoints(needString(*chars, "strip"))) set.insert(cp);
  }
  auto strippable = [&](const std::string& cp) {
    if (!whitespace) return set.count(cp) > 0;
    size_t k = 0;
    return isPySpace(nextCodePoint(cp, k));
  };
  size_t begin = 0, end = cps.size();
  if (left)
    while (begin < end && strippable(cps[begin])) ++begin;
  if (right)
    while (end > begin && strippable(cps[end - 1])) --end;
  std::string out;
  for (size_t k = begin; k < end; ++k) out += cps[k];
  return out;
}

bool isSupportedFilter(const std::string& name) { return filters().count(name) > 0; }
bool isSupportedTest(const std::string& name) { return tests().count(name) > 0; }

Value applyFilter(const std::string& name, const Value& v, const CallArgs& args) {
  if (name == "trim") return Value::string(pyStrip(toStr(v), args.get(0, "chars"), true, true));
  if (name == "tojson") {
    JsonOptions o;
    // transformers' signature: tojson(x, ensure_ascii=False, indent=None, separators=None,
    // sort_keys=False).
    if (const Value* ascii = args.get(0, "ensure_ascii")) o.ensure_ascii = truthy(*ascii);
    if (const Value* indent = args.get(1, "indent"); indent && indent->kind != Value::Kind::kNone) {
      o.indent = static_cast<int>(toInt(*indent, 0));
    }
    if (const Value* sort = args.get(3, "sort_keys")) o.sort_keys = truthy(*sort);
    if (const Value* seps = args.get(2, "separators");
        seps && seps->isList() && seps->list->size() == 2) {
      o.item_separator = toStr((*seps->list)[0]);
      o.key_separator = toStr((*seps->list)[1]);
    }
    try {
      return Value::string(toJson(v, o));
    } catch (const std::invalid_argument& e) {
      throw TemplateError(std::string("tojson: ") + e.what());
    }
  }
  if (name == "length" || name == "count") {
    switch (v.kind) {
      case Value::Kind::kString:
        return Value::integer(static_cast<int64_t>(codePoints(v.s).size()));
      case Value::Kind::kList:
        return Value::integer(static_cast<int64_t>(v.list->size()));
      case Value::Kind::kDict:
        return Value::integer(static_cast<int64_t>(v.dict->items.size()));
      case Value::Kind::kUndefined:
        return Value::integer(0);
      default:
        throw TemplateError("object of type '" + typeName(v) + "' has no len()");
    }
  }
  if (name == "upper") return Value::string(mapCase(toStr(v), 1));
  if (name == "lower") return Value::string(mapCase(toStr(v), 0));
  if (name == "title") return Value::string(titleCase(toStr(v)));
  if (name == "capitalize") {
    const auto cps = codePoints(toStr(v));
    std::string out;
    for (size_t k = 0; k < cps.size(); ++k) out += mapCase(cps[k], k == 0 ? 1 : 0);
    return Value::string(out);
  }
  if (name == "first" || name == "last") {
    const List items = iterate(v, name);
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    const Value* sep = args.get(0, "d");
    const Value* attr = args.get(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(v, name)) {
      if (!first) out += sep ? toStr(*sep) : "";
      first = false;
      out += toStr(attr ? attributeOf(item, toStr(*attr)) : item);
    }
    return Value::string(out);
  }
  if (name == "default" || name == "d") {
    const Value* fallback = args.get(0, "default_value");
    const Value* boolean = args.get(1, "boolean");
    const bool use = v.isUndefined() || (boolean && truthy(*boolean) && !truthy(v));
    return use ? (fallback ? *fallback : Value::string("")) : v;
  }
  if (name == "items") {
    if (v.isUndefined()) return Value::makeList();
    if (!v.isDict()) throw TemplateError("items: expected a mapping, not " + typeName(v));
    List out;
    for (const auto& [k, val] : v.dict->items)
      out.push_back(Value::makeList({Value::string(k), val}));
    return Value::makeList(std::move(out));
  }
  if (name == "string") return Value::string(toStr(v));
  if (name == "safe") return v;
  if (name == "int") {
    const Value* fallback = args.get(0, "default");
    return Value::integer(toInt(v, fallback ? toInt(*fallback, 0) : 0));
  }
  if (name == "float") {
    if (v.isNumber()) return Value::real(toDouble(v));
    try {
      return Value::real(std::stod(toStr(v)));
    } catch (const std::exception&) {
      return Value::real(0);
    }
  }
  if (name == "abs") {
    if (v.kind == Value::Kind::kFloat) return Value::real(std::fabs(v.f));
    return Value::integer(std::llabs(toInt(v, 0)));
  }
  if (name == "list") return Value::makeList(iterate(v, name));
  if (name == "reverse") {
    if (v.isString()) {
      auto cps = codePoints(v.s);
      std::string out;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
      return Value::string(out);
    }
    List items = iterate(v, name);
    std::reverse(items.begin(), items.end());
    return Value::makeList(std::move(items));
  }
  if (name == "unique") {
    List out;
    for (const Value& item : iterate(v, name)) {
      if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return equals(o, item); })) {
        out.push_back(item);
      }
    }
    return Value::makeList(std::move(out));
  }
  if (name == "replace") {
    const std::string& from = needString(need(args, 0, "old", name), name);
    const std::string& to = needString(need(args, 1, "new", name), name);
    const Value* count = args.get(2, "count");
    return Value::string(replaceAll(toStr(v), from, to, count ? toInt(*count, -1) : -1));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    return selectFilter(name, v, args);
  }
  if (name == "map") return mapFilter(v, args);
  throw TemplateError("filter '" + name + "' is not supported");
}

bool applyTest(const std::string& name, const Value& v, const CallArgs& args) {
  using K = Value::Kind;
  if (name == "defined") return !v.isUndefined();
  if (name == "undefined") return v.isUndefined();
  if (name == "none") return v.kind == K::kNone;
  if (name == "string") return v.isString();
  if (name == "number") return v.isNumber();
  if (name == "integer") return v.kind == K::kInt;
  if (name == "float") return v.kind == K::kFloat;
  if (name == "boolean") return v.kind == K::kBool;
  if (name == "true") return v.kind == K::kBool && v.b;
  if (name == "false") return v.kind == K::kBool && !v.b;
  if (name == "mapping") return v.isDict();
  if (name == "iterable") return v.isList() || v.isDict() || v.isString() || v.isUndefined();
  if (name == "sequence") return v.isList() || v.isDict() || v.isString();
  if (name == "callable") return v.kind == K::kFunction;
  if (name == "lower") return v.isString() && mapCase(v.s, 0) == v.s;
  if (name == "upper") return v.isString() && mapCase(v.s, 1) == v.s;
  if (name == "odd" || name == "even") {
    if (v.kind != K::kInt) throw TemplateError("test '" + name + "' expects an integer");
    return (v.i % 2 != 0) == (name == "odd");
  }
  const Value& other = need(args, 0, "other", "test '" + name + "'");
  if (name == "equalto" || name == "eq" || name == "==") return equals(v, other);
  if (name == "ne") return !equals(v, other);
  if (name == "sameas") {
    // Python's `is`: the same object. Literal strings and small numbers are interned there, so
    // equal scalars count as the same; containers only when they are one object.
    if (v.kind != other.kind) return false;
    if (v.isList()) return v.list == other.list;
    if (v.dict) return v.dict == other.dict;
    if (v.kind == K::kFunction) return v.fn == other.fn;
    return equals(v, other);
  }
  if (name == "divisibleby") {
    const int64_t d = toInt(other, 0);
    if (d == 0) throw TemplateError("divisibleby(0)");
    return toInt(v, 0) % d == 0;
  }
  if (name == "in") {
    if (other.isString()) return v.isString() && other.s.find(v.s) != std::string::npos;
    for (const Value& item : iterate(other, "in")) {
      if (equals(item, v)) return true;
    }
    return false;
  }
  try {
    const int c = compare(v, other);
    if (name == "lt") return c < 0;
    if (name == "le") return c <= 0;
    if (name == "gt") return c > 0;
    if (name == "ge") return c >= 0;
  } catch (const std::invalid_argument& e) {
    throw TemplateError(e.what());
  }
  throw TemplateError("test '" + name + "' is not supported");
}

}  // namespace cxxlaunch::text::jinja
