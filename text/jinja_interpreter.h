#pragma once
// A parsed Jinja template and its interpreter: renders the tree of text/jinja_parser.h over a
// context of variables, with Jinja2's scoping (a for loop's body has its own scope per iteration,
// so `set` inside it is not seen after it; namespace attributes are), loop variables, break and
// continue (transformers enables loopcontrols) and Python's operators. An error while rendering
// is an InvalidArgument "chat_template line N: ...". Internal to text/.
//
// Thread-safety: a Template is immutable after construction; render may run from many threads.

#include <string>

#include "text/jinja_ast.h"

namespace cxxlaunch::text::jinja {

class Template {
 public:
  // Lexes (trim_blocks, lstrip_blocks) and parses `source`; InvalidArgument on a syntax error or a
  // construct outside the subset.
  explicit Template(const std::string& source);

  // `context`'s variables over the global functions (raise_exception, namespace, range, dict,
  // strftime_now).
  std::string render(const Dict& context) const;

 private:
  Body body_;
};

}  // namespace cxxlaunch::text::jinja
