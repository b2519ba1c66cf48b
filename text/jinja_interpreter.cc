#include "text/jinja_interpreter.h"

#include <cmath>

#include "common/error.h"
#include "text/jinja_builtins.h"
#include "text/jinja_lexer.h"
#include "text/jinja_parser.h"

namespace cxxlaunch::text::jinja {

namespace {

// Variables of one scope; lookups go outwards through `parent`.
struct Scope {
  Dict vars;
  const Scope* parent = nullptr;
  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent) {
      if (const Value* v = s->vars.find(name)) return v;
    }
    return nullptr;
  }
};

enum class Flow { kNormal, kBreak, kContinue };

// An undefined value that remembers why, in Jinja2's words, for the error when it is used.
Value undefinedNamed(std::string what) {
  Value v;
  v.s = std::move(what);  // for "'x' is undefined" messages; prints as ""
  return v;
}

int64_t pyFloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// Python's slice indices for a sequence of `n` items.
std::vector<int64_t> sliceIndices(int64_t n, const Value* start, const Value* stop,
                                  const Value* step_v) {
  auto asInt = [](const Value* v, const char* what) -> std::optional<int64_t> {
    if (v == nullptr || v->kind == Value::Kind::kNone) return std::nullopt;
    if (v->kind != Value::Kind::kInt)
      throw TemplateError(std::string("slice ") + what + " must be an integer");
    return v->i;
  };
  const int64_t step = asInt(step_v, "step").value_or(1);
  if (step == 0) throw TemplateError("slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> v, int64_t fallback) {
    if (!v) return fallback;
    int64_t k = *v;
    if (k < 0) k += n;
    if (step > 0) return std::clamp<int64_t>(k, 0, n);
    return std::clamp<int64_t>(k, -1, n - 1);
  };
  const int64_t from = clamp(asInt(start, "start"), step > 0 ? 0 : n - 1);
  const int64_t to = clamp(asInt(stop, "stop"), step > 0 ? n : -1);
  std::vector<int64_t> out;
  for (int64_t k = from; step > 0 ? k < to : k > to; k += step) out.push_back(k);
  return out;
}

class Interpreter {
 public:
  explicit Interpreter(std::string& out) : out_(out) {}

  Flow run(const Body& body, Scope& scope) {
    for (const auto& node : body) {
      const Flow flow = runNode(*node, scope);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

 private:
  Flow runNode(const Node& node, Scope& scope) {
    switch (node.kind) {
      case Node::Kind::kText:
        out_ += node.text;
        return Flow::kNormal;
      case Node::Kind::kOutput:
        out_ += toStr(eval(*node.expr, scope));
        return Flow::kNormal;
      case Node::Kind::kIf:
        for (const auto& [condition, body] : node.branches) {
          if (!condition || truthy(eval(*condition, scope))) return run(body, scope);
        }
        return Flow::kNormal;
      case Node::Kind::kFor:
        return runFor(node, scope);
      case Node::Kind::kSet: {
        Value v = eval(*node.expr, scope);
        assign(node, scope, std::move(v));
        return Flow::kNormal;
      }
      case Node::Kind::kSetBlock: {
        std::string captured;
        Interpreter inner(captured);
        Scope block{{}, &scope};
        inner.run(node.body, block);
        assign(node, scope, Value::string(std::move(captured)));
        return Flow::kNormal;
      }
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  void assign(const Node& node, Scope& scope, Value v) {
    if (node.attr.empty()) {
      scope.vars.set(node.targets[0], std::move(v));
      return;
    }
    const Value* target = scope.find(node.targets[0]);
    if (target == nullptr || target->kind != Value::Kind::kNamespace) {
      throwAt(node.line, "cannot assign attribute '" + node.attr + "' of '" + node.targets[0] +
                             "': it is not a namespace()");
    }
    target->dict->set(node.attr, std::move(v));
  }

  // What a for loop walks: builtins' iterate, with the template's line on its error.
  List iterable(const Value& v, int line) {
    try {
      return iterate(v, "for");
    } catch (const TemplateError& err) {
      throwAt(line, err.what());
    }
  }

  void bindTargets(const Node& node, Scope& scope, const Value& item) {
    if (node.targets.size() == 1) {
      scope.vars.set(node.targets[0], item);
      return;
    }
    const List parts = iterable(item, node.line);
    if (parts.size() != node.targets.size()) {
      throwAt(node.line, "cannot unpack " + std::to_string(parts.size()) + " values into " +
                             std::to_string(node.targets.size()) + " loop variables");
    }
    for (size_t k = 0; k < parts.size(); ++k) scope.vars.set(node.targets[k], parts[k]);
  }

  Flow runFor(const Node& node, Scope& scope) {
    List items = iterable(eval(*node.expr, scope), node.line);
    if (node.filter) {  // `for x in xs if c`: loop.* counts the items that pass
      List kept;
      for (const Value& item : items) {
        Scope probe{{}, &scope};
        bindTargets(node, probe, item);
        if (truthy(eval(*node.filter, probe))) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      run(node.else_body, scope);
      return Flow::kNormal;
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < n; ++k) {
      Scope body{{}, &scope};
      Dict loop;
      loop.set("index", Value::integer(k + 1));
      loop.set("index0", Value::integer(k));
      loop.set("revindex", Value::integer(n - k));
      loop.set("revindex0", Value::integer(n - k - 1));
      loop.set("first", Value::boolean(k == 0));
      loop.set("last", Value::boolean(k == n - 1));
      loop.set("length", Value::integer(n));
      loop.set("depth", Value::integer(1));
      loop.set("depth0", Value::integer(0));
      loop.set("previtem", k > 0 ? items[k - 1] : undefinedNamed("'loop.previtem' is undefined"));
      loop.set("nextitem",
               k + 1 < n ? items[k + 1] : undefinedNamed("'loop.nextitem' is undefined"));
      body.vars.set("loop", Value::makeDict(std::move(loop)));
      bindTargets(node, body, items[k]);
      if (run(node.body, body) == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  CallArgs args(const Expr& e, size_t first, Scope& scope) {
    CallArgs a;
    const size_t n_keywords = e.kwnames.size();
    const size_t n_positional = e.children.size() - first - n_keywords;
    for (size_t k = 0; k < n_positional; ++k)
      a.positional.push_back(eval(*e.children[first + k], scope));
    for (size_t k = 0; k < n_keywords; ++k) {
      a.keywords.emplace_back(e.kwnames[k], eval(*e.children[first + n_positional + k], scope));
    }
    return a;
  }

  Value eval(const Expr& e, Scope& scope) {
    try {
      return evalInner(e, scope);
    } catch (const TemplateError& err) {
      throwAt(e.line, err.what());
    } catch (const std::invalid_argument& err) {
      throwAt(e.line, err.what());
    }
  }

  [[noreturn]] static void undefinedError(const Value& v) {
    throw TemplateError(v.s.empty() ? std::string("a value is undefined") : v.s);
  }

  Value evalInner(const Expr& e, Scope& scope) {
    using K = Expr::Kind;
    switch (e.kind) {
      case K::kLiteral:
        return e.literal;
      case K::kName: {
        const Value* v = scope.find(e.name);
        return v ? *v : undefinedNamed("'" + e.name + "' is undefined");
      }
      case K::kList: {
        List items;
        for (const auto& c : e.children) items.push_back(eval(*c, scope));
        return Value::makeList(std::move(items));
      }
      case K::kDict: {
        Dict d;
        for (size_t k = 0; k + 1 < e.children.size(); k += 2) {
          const Value key = eval(*e.children[k], scope);
          if (!key.isString()) throw TemplateError("dict keys must be strings here");
          d.set(key.s, eval(*e.children[k + 1], scope));
        }
        return Value::makeDict(std::move(d));
      }
      case K::kAttr: {
        const Value obj = eval(*e.children[0], scope);
        if (obj.isUndefined()) undefinedError(obj);
        if (obj.dict) {
          if (const Value* v = obj.dict->find(e.name)) return *v;
        }
        return undefinedNamed("'" + typeName(obj) + " object' has no attribute '" + e.name + "'");
      }
      case K::kSubscript:
        return subscript(eval(*e.children[0], scope), eval(*e.children[1], scope));
      case K::kSlice: {
        const Value obj = eval(*e.children[0], scope);
        Value parts[3];
        for (int k = 0; k < 3; ++k) {
          if (e.children[k + 1]) parts[k] = eval(*e.children[k + 1], scope);
        }
        auto ptr = [&](int k) { return e.children[k + 1] ? &parts[k] : nullptr; };
        if (obj.isList()) {
          List out;
          for (int64_t k :
               sliceIndices(static_cast<int64_t>(obj.list->size()), ptr(0), ptr(1), ptr(2))) {
            out.push_back((*obj.list)[k]);
          }
          return Value::makeList(std::move(out));
        }
        if (obj.isString()) {
          const auto cps = codePoints(obj.s);
          std::string out;
          for (int64_t k : sliceIndices(static_cast<int64_t>(cps.size()), ptr(0), ptr(1), ptr(2)))
            out += cps[k];
          return Value::string(out);
        }
        if (obj.isUndefined()) undefinedError(obj);
        throw TemplateError("'" + typeName(obj) + "' object is not subscriptable");
      }
      case K::kCall: {
        const Expr& callee = *e.children[0];
        if (callee.kind == K::kAttr) {
          const Value obj = eval(*callee.children[0], scope);
          if (obj.isUndefined()) undefinedError(obj);
          bool found = false;
          Value result = callMethod(obj, callee.name, args(e, 1, scope), found);
          if (found) return result;
          if (!obj.dict || obj.dict->find(callee.name) == nullptr) {
            throw TemplateError("method '" + callee.name + "' of '" + typeName(obj) +
                                "' is not supported");
          }
        }
        const Value fn = eval(callee, scope);
        if (fn.kind != Value::Kind::kFunction) {
          if (fn.isUndefined() && callee.kind == K::kName) {
            throw TemplateError("function '" + callee.name + "' is not supported");
          }
          throw TemplateError("'" + typeName(fn) + "' object is not callable");
        }
        return (*fn.fn)(args(e, 1, scope));
      }
      case K::kFilter:
        return applyFilter(e.name, eval(*e.children[0], scope), args(e, 1, scope));
      case K::kTest:
        return Value::boolean(applyTest(e.name, eval(*e.children[0], scope), args(e, 1, scope)) !=
                              e.negated);
      case K::kUnary: {
        const Value v = eval(*e.children[0], scope);
        if (e.name == "not") return Value::boolean(!truthy(v));
        if (v.kind == Value::Kind::kFloat) return Value::real(e.name == "-" ? -v.f : v.f);
        if (v.isNumber()) {
          const int64_t i = v.kind == Value::Kind::kBool ? v.b : v.i;
          return Value::integer(e.name == "-" ? -i : i);
        }
        throw TemplateError("bad operand type for unary " + e.name + ": '" + typeName(v) + "'");
      }
      case K::kBinary:
        return binary(e, scope);
      case K::kCompare: {
        Value left = eval(*e.children[0], scope);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value right = eval(*e.children[k + 1], scope);
          if (!compareOp(e.ops[k], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case K::kConditional:
        if (truthy(eval(*e.children[0], scope))) return eval(*e.children[1], scope);
        return e.children[2] ? eval(*e.children[2], scope) : Value();
    }
    return Value();
  }

  static Value subscript(const Value& obj, const Value& key) {
    if (obj.isUndefined()) undefinedError(obj);
    if (obj.isList() || obj.isString()) {
      if (key.kind != Value::Kind::kInt) {
        if (obj.isList())
          return undefinedNamed("'list object' has no attribute '" + toStr(key) + "'");
        throw TemplateError("string indices must be integers");
      }
      if (obj.isList()) {
        const int64_t n = static_cast<int64_t>(obj.list->size());
        const int64_t k = key.i < 0 ? key.i + n : key.i;
        if (k < 0 || k >= n)
          return undefinedNamed("list object has no element " + std::to_string(key.i));
        return (*obj.list)[k];
      }
      const auto cps = codePoints(obj.s);
      const int64_t n = static_cast<int64_t>(cps.size());
      const int64_t k = key.i < 0 ? key.i + n : key.i;
      if (k < 0 || k >= n)
        return undefinedNamed("str object has no element " + std::to_string(key.i));
      return Value::string(cps[k]);
    }
    if (obj.dict) {
      if (key.isString()) {
        if (const Value* v = obj.dict->find(key.s)) return *v;
      }
      return undefinedNamed("'" + typeName(obj) + " object' has no attribute '" + toStr(key) + "'");
    }
    // Jinja2 gives undefined, not an error, for an item of None or a number.
    return undefinedNamed("'" + typeName(obj) + " object' has no attribute '" + toStr(key) + "'");
  }

  static bool contains(const Value& container, const Value& item) {
    if (container.isString()) {
      if (!item.isString()) throw TemplateError("'in <string>' requires string as left operand");
      return container.s.find(item.s) != std::string::npos;
    }
    if (container.isList()) {
      for (const Value& v : *container.list) {
        if (equals(v, item)) return true;
      }
      return false;
    }
    if (container.dict) return item.isString() && container.dict->find(item.s) != nullptr;
    if (container.isUndefined()) return false;
    throw TemplateError("argument of type '" + typeName(container) + "' is not iterable");
  }

  static bool compareOp(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return equals(a, b);
    if (op == "!=") return !equals(a, b);
    if (op == "in") return contains(b, a);
    if (op == "not in") return !contains(b, a);
    const int c = compare(a, b);
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  Value binary(const Expr& e, Scope& scope) {
    const std::string& op = e.name;
    Value a = eval(*e.children[0], scope);
    if (op == "and") return truthy(a) ? eval(*e.children[1], scope) : a;
    if (op == "or") return truthy(a) ? a : eval(*e.children[1], scope);
    const Value b = eval(*e.children[1], scope);
    if (op == "~") return Value::string(toStr(a) + toStr(b));
    if (a.isUndefined()) undefinedError(a);
    if (b.isUndefined()) undefinedError(b);
    if (op == "+") {
      if (a.isString() && b.isString()) return Value::string(a.s + b.s);
      if (a.isList() && b.isList()) {
        List out = *a.list;
        out.insert(out.end(), b.list->begin(), b.list->end());
        return Value::makeList(std::move(out));
      }
    }
    if (op == "*" && (a.isString() || b.isString()) &&
        (a.kind == Value::Kind::kInt || b.kind == Value::Kind::kInt)) {
      const std::string& s = a.isString() ? a.s : b.s;
      const int64_t n = a.isString() ? b.i : a.i;
      if (n * static_cast<int64_t>(s.size()) > (64 << 20))
        throw TemplateError("string repetition too large");
      std::string out;
      for (int64_t k = 0; k < n; ++k) out += s;
      return Value::string(out);
    }
    if (!a.isNumber() || !b.isNumber()) {
      throw TemplateError("unsupported operand type(s) for " + op + ": '" + typeName(a) +
                          "' and '" + typeName(b) + "'");
    }
    const bool ints = a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat;
    const int64_t x = a.kind == Value::Kind::kBool ? a.b : a.i;
    const int64_t y = b.kind == Value::Kind::kBool ? b.b : b.i;
    const double fx = toDouble(a), fy = toDouble(b);
    if (op == "+") return ints ? Value::integer(x + y) : Value::real(fx + fy);
    if (op == "-") return ints ? Value::integer(x - y) : Value::real(fx - fy);
    if (op == "*") return ints ? Value::integer(x * y) : Value::real(fx * fy);
    if (op == "/") {
      if (fy == 0) throw TemplateError("division by zero");
      return Value::real(fx / fy);
    }
    if (op == "//" || op == "%") {
      if (fy == 0) throw TemplateError("integer division or modulo by zero");
      if (ints) return Value::integer(op == "//" ? pyFloorDiv(x, y) : x - pyFloorDiv(x, y) * y);
      const double q = std::floor(fx / fy);
      return Value::real(op == "//" ? q : fx - q * fy);
    }
    if (op == "**") {
      if (ints && y >= 0) {
        int64_t r = 1;
        for (int64_t k = 0; k < y && k < 64; ++k) r *= x;
        return Value::integer(r);
      }
      return Value::real(std::pow(fx, fy));
    }
    throw TemplateError("operator '" + op + "' is not supported");
  }

  std::string& out_;
};

}  // namespace

Template::Template(const std::string& source) : body_(parse(lex(source))) {}

std::string Template::render(const Dict& context) const {
  Scope globals{globalFunctions(), nullptr};
  Scope root{context, &globals};
  std::string out;
  Interpreter(out).run(body_, root);
  return out;
}

}  // namespace cxxlaunch::text::jinja
