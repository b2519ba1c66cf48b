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

// Python's str.strip/lstrip/rstrip: `chars` null strips whitespace (str.isspace()).
std::string pyStrip(const std::string& s, const Value* chars, bool left, bool right);

}  // namespace cxxlaunch::text::jinja
