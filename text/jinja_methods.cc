// The str and dict methods templates call, and the global functions (internal to text/).

#include <unicode/uchar.h>

#include <ctime>

#include "text/jinja_builtins.h"
#include "text/unicode.h"

namespace cxxlaunch::text::jinja {

namespace {

Value split(const std::string& s, const Value* sep, int64_t maxsplit) {
  List parts;
  if (sep == nullptr || sep->kind == Value::Kind::kNone) {
    // Runs of whitespace, none at the ends.
    std::vector<std::pair<size_t, size_t>> words;
    size_t i = 0, start = std::string::npos;
    while (i < s.size()) {
      const size_t at = i;
      const bool space = isPySpace(nextCodePoint(s, i));
      if (!space && start == std::string::npos) {
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          parts.push_back(Value::string(pyStrip(s.substr(at), nullptr, false, true)));
          return Value::makeList(std::move(parts));
        }
        start = at;
      }
      if (space && start != std::string::npos) {
        parts.push_back(Value::string(s.substr(start, at - start)));
        start = std::string::npos;
      }
    }
    if (start != std::string::npos) parts.push_back(Value::string(s.substr(start)));
    return Value::makeList(std::move(parts));
  }
  const std::string& by = needString(*sep, "split");
  if (by.empty()) throw TemplateError("split: empty separator");
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    const size_t hit = s.find(by, pos);
    if (hit == std::string::npos) break;
    parts.push_back(Value::string(s.substr(pos, hit - pos)));
    pos = hit + by.size();
  }
  parts.push_back(Value::string(s.substr(pos)));
  return Value::makeList(std::move(parts));
}

}  // namespace

Value callMethod(const Value& obj, const std::string& name, const CallArgs& args, bool& found) {
  found = true;
  if (obj.isString()) {
    const std::string& s = obj.s;
    if (name == "startswith" || name == "endswith") {
      const Value& arg = need(args, 0, "prefix", name);
      List options = arg.isList() ? *arg.list : List{arg};
      for (const Value& o : options) {
        const std::string& p = needString(o, name);
        if (p.size() > s.size()) continue;
        if (name == "startswith" ? s.compare(0, p.size(), p) == 0
                                 : s.compare(s.size() - p.size(), p.size(), p) == 0) {
          return Value::boolean(true);
        }
      }
      return Value::boolean(false);
    }
    if (name == "strip") return Value::string(pyStrip(s, args.get(0, "chars"), true, true));
    if (name == "lstrip") return Value::string(pyStrip(s, args.get(0, "chars"), true, false));
    if (name == "rstrip") return Value::string(pyStrip(s, args.get(0, "chars"), false, true));
    if (name == "split") {
      const Value* max = args.get(1, "maxsplit");
      return split(s, args.get(0, "sep"), max ? toInt(*max, -1) : -1);
    }
    if (name == "upper") return Value::string(mapCase(s, 1));
    if (name == "lower") return Value::string(mapCase(s, 0));
    if (name == "title") {
      // str.title(): a cased character after an uncased one starts a word.
      std::string out;
      bool prev_cased = false;
      size_t i = 0;
      while (i < s.size()) {
        const size_t at = i;
        const char32_t c = nextCodePoint(s, i);
        const bool cased = u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_CASED);
        out += mapCase(s.substr(at, i - at), prev_cased ? 0 : 2);
        prev_cased = cased;
      }
      return Value::string(out);
    }
    if (name == "capitalize") return applyFilter("capitalize", obj, {});
    if (name == "replace") {
      const Value* count = args.get(2, "count");
      return Value::string(replaceAll(s, needString(need(args, 0, "old", name), name),
                                      needString(need(args, 1, "new", name), name),
                                      count ? toInt(*count, -1) : -1));
    }
    if (name == "find") {
      const size_t at = s.find(needString(need(args, 0, "sub", name), name));
      return Value::integer(
          at == std::string::npos ? -1 : static_cast<int64_t>(codePoints(s.substr(0, at)).size()));
    }
    if (name == "count") {
      const std::string& sub = needString(need(args, 0, "sub", name), name);
      if (sub.empty()) return Value::integer(static_cast<int64_t>(codePoints(s).size()) + 1);
      int64_t n = 0;
      for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
      return Value::integer(n);
    }
    if (name == "join") {
      std::string out;
      bool first = true;
      for (const Value& item : iterate(need(args, 0, "iterable", name), name)) {
        if (!first) out += s;
        first = false;
        out += needString(item, "join");
      }
      return Value::string(out);
    }
  } else if (obj.isDict()) {
    const Dict& d = *obj.dict;
    if (name == "get") {
      const Value& key = need(args, 0, "key", name);
      const Value* found_value = key.isString() ? d.find(key.s) : nullptr;
      if (found_value) return *found_value;
      const Value* fallback = args.get(1, "default");
      return fallback ? *fallback : Value::none();
    }
    if (name == "items") return applyFilter("items", obj, {});
    if (name == "keys" || name == "values") {
      List out;
      for (const auto& [k, v] : d.items) out.push_back(name == "keys" ? Value::string(k) : v);
      return Value::makeList(std::move(out));
    }
  }
  found = false;
  return Value();
}

Dict globalFunctions() {
  Dict g;
  g.set("raise_exception", Value::function([](const CallArgs& args) -> Value {
          const Value* msg = args.get(0, "message");
          throw TemplateError("raise_exception: " + (msg ? toStr(*msg) : std::string()));
        }));
  g.set("namespace", Value::function([](const CallArgs& args) {
          Dict d;
          if (!args.positional.empty()) {
            if (!args.positional[0].isDict()) throw TemplateError("namespace() takes a mapping");
            d = *args.positional[0].dict;
          }
          for (const auto& [k, v] : args.keywords) d.set(k, v);
          return Value::makeNamespace(std::move(d));
        }));
  g.set("dict", Value::function([](const CallArgs& args) {
          Dict d;
          for (const auto& [k, v] : args.keywords) d.set(k, v);
          return Value::makeDict(std::move(d));
        }));
  g.set("range", Value::function([](const CallArgs& args) {
          int64_t start = 0, stop = 0, step = 1;
          auto num = [](const Value& v) {
            if (v.kind != Value::Kind::kInt) throw TemplateError("range() takes integers");
            return v.i;
          };
          if (args.positional.size() == 1) {
            stop = num(args.positional[0]);
          } else if (args.positional.size() >= 2) {
            start = num(args.positional[0]);
            stop = num(args.positional[1]);
            if (args.positional.size() > 2) step = num(args.positional[2]);
          }
          if (step == 0) throw TemplateError("range() step must not be zero");
          if ((stop - start) / step > 100000) throw TemplateError("range() too large");
          List out;
          for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step)
            out.push_back(Value::integer(k));
          return Value::makeList(std::move(out));
        }));
  g.set("strftime_now", Value::function([](const CallArgs& args) {
          // transformers: datetime.now().strftime(format), local time.
          const std::string& format =
              needString(need(args, 0, "format", "strftime_now"), "strftime_now");
          const std::time_t now = std::time(nullptr);
          std::tm local{};
          localtime_r(&now, &local);
          char buf[256];
          const size_t n = std::strftime(buf, sizeof buf, format.c_str(), &local);
          return Value::string(std::string(buf, n));
        }));
  return g;
}

}  // namespace cxxlaunch::text::jinja
