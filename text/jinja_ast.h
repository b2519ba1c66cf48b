#pragma once
// The tokens and syntax tree of the Jinja subset that chat templates use (text/jinja_lexer.h
// makes the tokens, jinja_parser.h the tree, jinja_interpreter.h runs it). Every token and node
// carries its line in the template, for messages. Internal to text/.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja_value.h"

namespace cxxlaunch::text::jinja {

struct Token {
  enum class Type {
    kText,
    kExprOpen,
    kExprClose,
    kStmtOpen,
    kStmtClose,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEnd
  };
  Type type;
  std::string value;  // text, name, unescaped string, number or operator
  int line = 1;
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,      // literal
    kName,         // name
    kList,         // children: items ([a, b] and tuples)
    kDict,         // children: key, value, key, value, ...
    kAttr,         // children[0].name
    kSubscript,    // children[0][children[1]]
    kSlice,        // children[0][children[1]:children[2]:children[3]], each may be null
    kCall,         // children[0](args): children[1..] (positional first, then kwnames)
    kFilter,       // children[0] | name(args)
    kTest,         // children[0] is [not] name(args)
    kUnary,        // name: "not", "-", "+"
    kBinary,       // name: "+", "-", "*", "/", "//", "%", "**", "~", "and", "or"
    kCompare,      // children[0] ops[0] children[1] ops[1] children[2] ... (chained)
    kConditional,  // children[1] if children[0] else children[2] (may be null)
  };
  Kind kind;
  int line = 1;
  Value literal;
  std::string name;
  std::vector<ExprPtr> children;
  std::vector<std::string> kwnames;  // kCall/kFilter/kTest: names of the trailing arguments
  std::vector<std::string> ops;      // kCompare
  bool negated = false;              // kTest: "is not"
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches: (condition, body) ..., an else branch with a null condition
    kFor,       // {% for targets in expr [if filter] %} body {% else %} else_body
    kSet,       // {% set targets[0] = expr %} or {% set targets[0].attr = expr %}
    kSetBlock,  // {% set targets[0] %} body {% endset %}
    kBreak,
    kContinue,
  };
  Kind kind;
  int line = 1;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::string> targets;
  std::string attr;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
};

}  // namespace cxxlaunch::text::jinja
