#include "text/jinja_parser.h"

#include <cstdlib>

#include "text/jinja_builtins.h"
#include "text/jinja_lexer.h"

namespace cxxlaunch::text::jinja {

namespace {

ExprPtr makeExpr(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  Body parseTemplate() {
    Body body = parseBody({});
    if (peek().type != Token::Type::kEnd) {
      throwAt(peek().line, "unexpected '" + peek().value + "'");
    }
    return body;
  }

 private:
  using Type = Token::Type;

  const Token& peek(size_t ahead = 0) const {
    const size_t k = std::min(pos_ + ahead, t_.size() - 1);
    return t_[k];
  }
  const Token& next() {
    const Token& tok = peek();
    if (pos_ < t_.size() - 1) ++pos_;
    return tok;
  }
  bool isOp(const std::string& op, size_t ahead = 0) const {
    return peek(ahead).type == Type::kOp && peek(ahead).value == op;
  }
  bool isName(const std::string& name, size_t ahead = 0) const {
    return peek(ahead).type == Type::kName && peek(ahead).value == name;
  }
  void expectOp(const std::string& op) {
    if (!isOp(op)) throwAt(peek().line, "expected '" + op + "', found " + describe(peek()));
    next();
  }
  void expectName(const std::string& name) {
    if (!isName(name)) throwAt(peek().line, "expected '" + name + "', found " + describe(peek()));
    next();
  }
  std::string identifier() {
    if (peek().type != Type::kName)
      throwAt(peek().line, "expected a name, found " + describe(peek()));
    return next().value;
  }
  void expectStmtClose() {
    if (peek().type != Type::kStmtClose) {
      throwAt(peek().line, "expected the end of the statement, found " + describe(peek()));
    }
    next();
  }
  static std::string describe(const Token& tok) {
    switch (tok.type) {
      case Type::kEnd:
        return "the end of the template";
      case Type::kExprClose:
        return "'}}'";
      case Type::kStmtClose:
        return "'%}'";
      case Type::kText:
        return "text";
      default:
        return "'" + tok.value + "'";
    }
  }

  // Statements up to a `{% NAME %}` whose NAME is in `stops` (left unread: the caller reads it).
  Body parseBody(const std::vector<std::string>& stops) {
    Body body;
    while (true) {
      const Token& tok = peek();
      if (tok.type == Type::kEnd) {
        if (!stops.empty())
          throwAt(tok.line, "the template ends before '{% " + stops.back() + " %}'");
        return body;
      }
      if (tok.type == Type::kText) {
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kText;
        node->line = tok.line;
        node->text = next().value;
        body.push_back(std::move(node));
      } else if (tok.type == Type::kExprOpen) {
        next();
        auto node = std::make_unique<Node>();
        node->kind = Node::Kind::kOutput;
        node->line = tok.line;
        node->expr = parseExpression();
        if (peek().type != Type::kExprClose) {
          throwAt(peek().line, "expected '}}', found " + describe(peek()));
        }
        next();
        body.push_back(std::move(node));
      } else if (tok.type == Type::kStmtOpen) {
        const Token& keyword = peek(1);
        for (const auto& stop : stops) {
          if (keyword.type == Type::kName && keyword.value == stop) return body;
        }
        next();
        if (auto node = parseStatement()) body.push_back(std::move(node));
      } else {
        throwAt(tok.line, "unexpected " + describe(tok));
      }
    }
  }

  NodePtr parseStatement() {
    const Token& keyword = peek();
    if (keyword.type != Type::kName) throwAt(keyword.line, "expected a statement name");
    const std::string name = next().value;
    auto node = std::make_unique<Node>();
    node->line = keyword.line;
    if (++depth_ > kMaxDepth) throwAt(node->line, "blocks nested too deeply");
    if (name == "if") {
      node->kind = Node::Kind::kIf;
      ExprPtr condition = parseExpression();
      expectStmtClose();
      while (true) {
        Body body = parseBody({"elif", "else", "endif"});
        node->branches.emplace_back(std::move(condition), std::move(body));
        next();  // {%
        const std::string which = next().value;
        if (which == "elif") {
          condition = parseExpression();
          expectStmtClose();
        } else if (which == "else") {
          expectStmtClose();
          node->branches.emplace_back(nullptr, parseBody({"endif"}));
          next();
          next();
          expectStmtClose();
          break;
        } else {
          expectStmtClose();
          break;
        }
      }
    } else if (name == "for") {
      node->kind = Node::Kind::kFor;
      node->targets.push_back(identifier());
      while (isOp(",")) {
        next();
        node->targets.push_back(identifier());
      }
      expectName("in");
      node->expr = parseExpression(/*with_condition=*/false);
      if (isName("if")) {
        next();
        node->filter = parseExpression(false);
      }
      if (isName("recursive")) throwAt(peek().line, "recursive for loops are not supported");
      expectStmtClose();
      node->body = parseBody({"else", "endfor"});
      next();
      if (next().value == "else") {
        expectStmtClose();
        node->else_body = parseBody({"endfor"});
        next();
        next();
      }
      expectStmtClose();
    } else if (name == "set") {
      node->targets.push_back(identifier());
      if (isOp(".")) {
        next();
        node->attr = identifier();
      }
      if (isOp(",")) throwAt(peek().line, "'set' with several targets is not supported");
      if (isOp("=")) {
        next();
        node->kind = Node::Kind::kSet;
        node->expr = parseExpression();
        expectStmtClose();
      } else {
        if (!node->attr.empty())
          throwAt(node->line, "a block 'set' of an attribute is not supported");
        node->kind = Node::Kind::kSetBlock;
        expectStmtClose();
        node->body = parseBody({"endset"});
        next();
        next();
        expectStmtClose();
      }
    } else if (name == "generation") {
      // transformers' {% generation %} marks assistant text for return_assistant_tokens_mask;
      // the rendering is the body's.
      expectStmtClose();
      node->kind = Node::Kind::kIf;
      auto always = makeExpr(Expr::Kind::kLiteral, node->line);
      always->literal = Value::boolean(true);
      Body body = parseBody({"endgeneration"});
      node->branches.emplace_back(std::move(always), std::move(body));
      next();
      next();
      expectStmtClose();
    } else if (name == "break" || name == "continue") {
      node->kind = name == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      expectStmtClose();
    } else if (name == "elif" || name == "else" || name.rfind("end", 0) == 0) {
      throwAt(keyword.line, "unexpected '{% " + name + " %}': no open block it belongs to");
    } else {
      throwAt(keyword.line, "statement '" + name + "' is not supported");
    }
    --depth_;
    return node;
  }

  ExprPtr parseExpression(bool with_condition = true) {
    // Nesting costs stack; no real template nests deeper than a handful.
    struct Depth {
      int& d;
      explicit Depth(int& depth, int line) : d(depth) {
        if (++d > kMaxDepth) throwAt(line, "expressions nested too deeply");
      }
      ~Depth() { --d; }
    } depth(depth_, peek().line);
    ExprPtr e = parseOr();
    while (with_condition && isName("if")) {
      const int line = next().line;
      auto cond = makeExpr(Expr::Kind::kConditional, line);
      cond->children.push_back(parseOr());
      cond->children.insert(cond->children.begin() + 1, std::move(e));
      if (isName("else")) {
        next();
        cond->children.push_back(parseExpression());
      } else {
        cond->children.push_back(nullptr);
      }
      e = std::move(cond);
    }
    return e;
  }

  ExprPtr binary(std::string op, ExprPtr left, ExprPtr right, int line) {
    auto e = makeExpr(Expr::Kind::kBinary, line);
    e->name = std::move(op);
    e->children.push_back(std::move(left));
    e->children.push_back(std::move(right));
    return e;
  }

  ExprPtr parseOr() {
    ExprPtr e = parseAnd();
    while (isName("or")) {
      const int line = next().line;
      e = binary("or", std::move(e), parseAnd(), line);
    }
    return e;
  }
  ExprPtr parseAnd() {
    ExprPtr e = parseNot();
    while (isName("and")) {
      const int line = next().line;
      e = binary("and", std::move(e), parseNot(), line);
    }
    return e;
  }
  ExprPtr parseNot() {
    if (isName("not")) {
      auto e = makeExpr(Expr::Kind::kUnary, next().line);
      e->name = "not";
      if (++depth_ > kMaxDepth) throwAt(e->line, "expressions nested too deeply");
      e->children.push_back(parseNot());
      --depth_;
      return e;
    }
    return parseCompare();
  }
  ExprPtr parseCompare() {
    ExprPtr first = parseMath1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      static const char* kOps[] = {"==", "!=", "<", "<=", ">", ">="};
      for (const char* o : kOps) {
        if (isOp(o)) op = o;
      }
      if (op.empty() && isName("in")) op = "in";
      if (op.empty() && isName("not") && isName("in", 1)) op = "not in";
      if (op.empty()) break;
      const int line = next().line;
      if (op == "not in") next();
      if (!cmp) {
        cmp = makeExpr(Expr::Kind::kCompare, line);
        cmp->children.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->children.push_back(parseMath1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr parseMath1() {
    ExprPtr e = parseConcat();
    while (isOp("+") || isOp("-")) {
      const Token& op = next();
      e = binary(op.value, std::move(e), parseConcat(), op.line);
    }
    return e;
  }
  ExprPtr parseConcat() {
    ExprPtr e = parseMath2();
    while (isOp("~")) {
      const int line = next().line;
      e = binary("~", std::move(e), parseMath2(), line);
    }
    return e;
  }
  ExprPtr parseMath2() {
    ExprPtr e = parsePow();
    while (isOp("*") || isOp("/") || isOp("//") || isOp("%")) {
      const Token& op = next();
      e = binary(op.value, std::move(e), parsePow(), op.line);
    }
    return e;
  }
  ExprPtr parsePow() {
    ExprPtr e = parseUnary();
    while (isOp("**")) {
      const int line = next().line;
      e = binary("**", std::move(e), parseUnary(), line);
    }
    return e;
  }
  ExprPtr parseUnary(bool with_filter = true) {
    ExprPtr e;
    if (isOp("-") || isOp("+")) {
      const Token& op = next();
      e = makeExpr(Expr::Kind::kUnary, op.line);
      e->name = op.value;
      if (++depth_ > kMaxDepth) throwAt(e->line, "expressions nested too deeply");
      e->children.push_back(parseUnary(false));
      --depth_;
    } else {
      e = parsePostfix(parsePrimary());
    }
    return with_filter ? parseFilters(std::move(e)) : std::move(e);
  }

  ExprPtr parsePrimary() {
    const Token& tok = next();
    switch (tok.type) {
      case Type::kString: {
        auto e = makeExpr(Expr::Kind::kLiteral, tok.line);
        std::string s = tok.value;
        while (peek().type == Type::kString) s += next().value;  // "a" "b" is "ab"
        e->literal = Value::string(std::move(s));
        return e;
      }
      case Type::kInt: {
        auto e = makeExpr(Expr::Kind::kLiteral, tok.line);
        e->literal = Value::integer(std::strtoll(tok.value.c_str(), nullptr, 10));
        return e;
      }
      case Type::kFloat: {
        auto e = makeExpr(Expr::Kind::kLiteral, tok.line);
        e->literal = Value::real(std::strtod(tok.value.c_str(), nullptr));
        return e;
      }
      case Type::kName: {
        auto e = makeExpr(Expr::Kind::kLiteral, tok.line);
        if (tok.value == "true" || tok.value == "True") {
          e->literal = Value::boolean(true);
        } else if (tok.value == "false" || tok.value == "False") {
          e->literal = Value::boolean(false);
        } else if (tok.value == "none" || tok.value == "None") {
          e->literal = Value::none();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = tok.value;
        }
        return e;
      }
      case Type::kOp:
        if (tok.value == "(") {
          if (isOp(")")) {
            next();
            return makeExpr(Expr::Kind::kList, tok.line);
          }
          ExprPtr e = parseExpression();
          if (isOp(",")) {  // a tuple: a list here, as nothing we support tells them apart
            auto list = makeExpr(Expr::Kind::kList, tok.line);
            list->children.push_back(std::move(e));
            while (isOp(",")) {
              next();
              if (isOp(")")) break;
              list->children.push_back(parseExpression());
            }
            e = std::move(list);
          }
          expectOp(")");
          return e;
        }
        if (tok.value == "[") {
          auto e = makeExpr(Expr::Kind::kList, tok.line);
          while (!isOp("]")) {
            e->children.push_back(parseExpression());
            if (!isOp(",")) break;
            next();
          }
          expectOp("]");
          return e;
        }
        if (tok.value == "{") {
          auto e = makeExpr(Expr::Kind::kDict, tok.line);
          while (!isOp("}")) {
            e->children.push_back(parseExpression());
            expectOp(":");
            e->children.push_back(parseExpression());
            if (!isOp(",")) break;
            next();
          }
          expectOp("}");
          return e;
        }
        break;
      default:
        break;
    }
    throwAt(tok.line, "unexpected " + describe(tok) + " in an expression");
  }

  // (args) after a call, filter or test: positional first, then name=value.
  void parseArgs(Expr& e) {
    expectOp("(");
    while (!isOp(")")) {
      if (peek().type == Type::kName && isOp("=", 1)) {
        e.kwnames.push_back(next().value);
        next();
        e.children.push_back(parseExpression());
      } else {
        if (!e.kwnames.empty()) throwAt(peek().line, "a positional argument after a keyword one");
        e.children.push_back(parseExpression());
      }
      if (!isOp(",")) break;
      next();
    }
    expectOp(")");
  }

  ExprPtr parsePostfix(ExprPtr e) {
    while (true) {
      if (isOp(".")) {
        const int line = next().line;
        auto attr = makeExpr(Expr::Kind::kAttr, line);
        attr->name = identifier();
        attr->children.push_back(std::move(e));
        e = std::move(attr);
      } else if (isOp("[")) {
        const int line = next().line;
        ExprPtr parts[3];
        int colons = 0;
        while (!isOp("]")) {
          if (isOp(":")) {
            if (++colons > 2) throwAt(line, "a slice has at most two ':'");
            next();
          } else {
            if (parts[colons]) throwAt(line, "expected ']' in a subscript");
            parts[colons] = parseExpression();
          }
        }
        next();
        if (colons == 0) {
          if (!parts[0]) throwAt(line, "an empty subscript");
          auto sub = makeExpr(Expr::Kind::kSubscript, line);
          sub->children.push_back(std::move(e));
          sub->children.push_back(std::move(parts[0]));
          e = std::move(sub);
        } else {
          auto slice = makeExpr(Expr::Kind::kSlice, line);
          slice->children.push_back(std::move(e));
          for (auto& p : parts) slice->children.push_back(std::move(p));
          e = std::move(slice);
        }
      } else if (isOp("(")) {
        auto call = makeExpr(Expr::Kind::kCall, peek().line);
        call->children.push_back(std::move(e));
        parseArgs(*call);
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  ExprPtr parseFilters(ExprPtr e) {
    while (true) {
      if (isOp("|")) {
        const int line = next().line;
        auto f = makeExpr(Expr::Kind::kFilter, line);
        f->name = identifier();
        if (!isSupportedFilter(f->name)) throwAt(line, "filter '" + f->name + "' is not supported");
        f->children.push_back(std::move(e));
        if (isOp("(")) parseArgs(*f);
        e = std::move(f);
      } else if (isName("is")) {
        const int line = next().line;
        auto test = makeExpr(Expr::Kind::kTest, line);
        if (isName("not")) {
          next();
          test->negated = true;
        }
        test->name = identifier();
        if (!isSupportedTest(test->name))
          throwAt(line, "test '" + test->name + "' is not supported");
        test->children.push_back(std::move(e));
        if (isOp("(")) {
          parseArgs(*test);
        } else if (startsPrimary()) {  // `is sameas false`, `is equalto 'x'`
          test->children.push_back(parsePostfix(parsePrimary()));
        }
        e = std::move(test);
      } else {
        return e;
      }
    }
  }

  bool startsPrimary() const {
    const Token& tok = peek();
    if (tok.type == Type::kString || tok.type == Type::kInt || tok.type == Type::kFloat)
      return true;
    if (tok.type == Type::kOp) return tok.value == "[" || tok.value == "{";
    if (tok.type != Type::kName) return false;
    static const char* kKeywords[] = {"else", "or", "and", "is", "in", "if", "not"};
    for (const char* k : kKeywords) {
      if (tok.value == k) return false;
    }
    return true;
  }

  static constexpr int kMaxDepth = 200;
  const std::vector<Token>& t_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

Body parse(const std::vector<Token>& tokens) { return Parser(tokens).parseTemplate(); }

}  // namespace cxxlaunch::text::jinja
