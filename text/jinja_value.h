#pragma once
// The values a chat template computes with, as Jinja2 (Python) sees them: undefined, none, bool,
// int, float, string, list, dict (insertion-ordered, string keys) and namespace. Lists, dicts and
// namespaces are shared by reference, as Python objects are, so `set ns.x = ...` is seen by every
// holder of `ns`. Printing, truthiness, equality and ordering follow Python's str(), bool(), ==
// and <. Internal to text/ (text/chat_template.h is the public face). Not thread-safe: a value
// tree belongs to one rendering.

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace cxxlaunch::text::jinja {

struct Value;
using List = std::vector<Value>;

// A Python dict with string keys: lookups are linear, which suits the handful of keys a message
// or a namespace has, and insertion order is kept as json.dumps and items() show it.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value value);
};

struct CallArgs;
using Function = std::function<Value(const CallArgs&)>;

struct Value {
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kFunction
  };
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;  // kDict and kNamespace
  std::shared_ptr<Function> fn;

  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value real(double v);
  static Value string(std::string v);
  static Value makeList(List items = {});
  static Value makeDict(Dict d = {});
  static Value makeNamespace(Dict d = {});
  static Value function(Function fn);
  static Value fromJson(const nlohmann::ordered_json& j);  // key order kept, as Python's json

  bool isUndefined() const { return kind == Kind::kUndefined; }
  bool isNumber() const {
    return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool;
  }
  bool isString() const { return kind == Kind::kString; }
  bool isList() const { return kind == Kind::kList; }
  bool isDict() const { return kind == Kind::kDict; }
};

// Positional and keyword arguments of a call, filter or test.
struct CallArgs {
  List positional;
  std::vector<std::pair<std::string, Value>> keywords;
  const Value* keyword(const std::string& name) const;
  // Positional `index`, else keyword `name`, else nullptr.
  const Value* get(size_t index, const std::string& name) const;
};

// Python's type name ("str", "list", "dict", "NoneType", ...), for messages.
std::string typeName(const Value& v);

bool truthy(const Value& v);
std::string toStr(const Value& v);   // str(v); undefined is ""
std::string toRepr(const Value& v);  // repr(v)
bool equals(const Value& a, const Value& b);
// -1, 0, 1 as Python orders numbers with numbers and strings with strings; other pairs throw
// std::invalid_argument.
int compare(const Value& a, const Value& b);
double toDouble(const Value& v);

// Python's repr of a float: the shortest text that reads back the same, "1.0", "1e+16", "inf".
std::string pythonFloat(double v);

struct JsonOptions {
  int indent = -1;  // -1: one line with ", " and ": "; else newlines and `indent` spaces
  bool sort_keys = false;
  bool ensure_ascii = false;   // non-ASCII as \uXXXX (surrogate pairs above U+FFFF)
  std::string item_separator;  // empty: json.dumps's default for the indent
  std::string key_separator;
};
// json.dumps(v, ensure_ascii=False, ...) as transformers' tojson filter calls it.
std::string toJson(const Value& v, const JsonOptions& options);

// Code points of a well-formed UTF-8 string.
std::vector<std::string> codePoints(const std::string& s);

}  // namespace cxxlaunch::text::jinja
