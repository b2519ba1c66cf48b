#pragma once
// Splits a template into tokens as Jinja2's lexer does with the settings transformers'
// apply_chat_template uses (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False):
// text between tags, with `{%- -%}`/`{{- -}}` whitespace control, the first newline after a
// block tag dropped and the spaces before a block tag on its own line dropped; comments removed;
// the inside of `{{ }}` and `{% %}` as names, literals and operators. Internal to text/.

#include <string>
#include <vector>

#include "text/jinja_ast.h"

namespace cxxlaunch::text::jinja {

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

// Throws InvalidArgument("chat_template line N: ...") for an unclosed tag or string or a
// character no token starts with.
std::vector<Token> lex(const std::string& source, const LexOptions& options = {});

// "chat_template line N: WHAT"
[[noreturn]] void throwAt(int line, const std::string& what);

}  // namespace cxxlaunch::text::jinja
