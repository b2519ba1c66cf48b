#pragma once
// Builds the syntax tree of a template from its tokens, as Jinja2's parser does for the subset
// that chat templates use (text/jinja_ast.h). A statement, filter or test outside the subset is
// an InvalidArgument that names it and its line:
//   chat_template line 3: filter 'wordcount' is not supported
// Internal to text/.

#include <vector>

#include "text/jinja_ast.h"

namespace cxxlaunch::text::jinja {

Body parse(const std::vector<Token>& tokens);

}  // namespace cxxlaunch::text::jinja
