#pragma once
// The filters, tests, methods and global functions chat templates call, with Jinja2's and
// Python's meaning (transformers' tojson: json.dumps with ensure_ascii=False). Internal to text/.
// Errors are TemplateError without a line; the interpreter adds it.

#include <stdexcept>
#include <string>

#include "text/jinja_value.h"

namespace cxxlaunch::text::jinja {

struct TemplateError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

bool isSupportedFilter(const std::string& name);
bool isSupportedTest(const std::string& name);

Value applyFilter(const std::string& name, const Value& operand, const CallArgs& args);
bool applyTest(const std::string& name, const Value& operand, const CallArgs& args);

// obj.name(args) for the str, dict and list methods templates call; nullopt-like: sets `found`
// to false when the type has no such method.
Value callMethod(const Value& obj, const std::string& name, const CallArgs& args, bool& found);

// raise_exception, namespace, range, dict and strftime_now, as transformers and Jinja2 give them.
Dict globalFunctions();

// Helpers the filters and methods share.
// Python's str.isspace() characters: what strip(), split() and the trim filter remove.
bool isPySpace(char32_t c);
// Argument `index`, else keyword `name`; TemplateError when neither is given.
const Value& need(const CallArgs& args, size_t index, const std::string& name,
                  const std::string& what);
const std::string& needString(const Value& v, const std::string& what);
// Characters mapped one by one through ICU's simple case mappings (0 lower, 1 upper, 2 title);
// Python maps a few characters, such as 'ß', to several.
std::string mapCase(const std::string& s, int mode);
// str.replace(from, to, count); count < 0: all.
std::string replaceAll(const std::string& s, const std::string& from, const std::string& to,
                       int64_t count);
// Items a filter iterates: a list's elements, a dict's keys, a string's characters.
List iterate(const Value& v, const std::string& what);
// int(v), or `fallback` when v does not read as a number.
int64_t toInt(const Value& v, int64_t fallback);

// Python's str.strip/lstrip/rstrip: `chars` null strips whitespace (str.isspace()).
std::string pyStrip(const std::string& s, const Value* chars, bool left, bool right);

}  // namespace cxxlaunch::text::jinja
