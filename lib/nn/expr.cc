// The `${expr}` language of model files: a tokenizer, a recursive-descent parser into a small tree, and its
// evaluator (Python-like arithmetic on ints and floats, comparisons, and/or/not, `a if c else b`, lists,
// indexing, len/range/min/max).
#include "nn/expr.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <memory>
#include <set>
#include <sstream>

#include "config/config.h"
#include "core/error.h"
#include "ops/registry.h"

namespace flowrun::nn {

const char* MValue::type_name() const {
  static const char* names[] = {"integer", "number", "boolean", "string", "list"};
  return names[v.index()];
}

namespace {

// The value as written in an expression, in full.
std::string written(const MValue& v) {
  if (v.is_string()) return cat("'", v.as_string(), "'");
  if (!v.is_list()) return v.text();
  std::string out = "[";
  for (size_t i = 0; i < v.as_list().size(); ++i) out += cat(i ? ", " : "", written(v.as_list()[i]));
  return out + "]";
}

// What checked_size counts, stopping once past `limit`.
size_t value_size(const MValue& v, size_t limit) {
  if (v.is_string()) return 1 + v.as_string().size();
  if (!v.is_list()) return 1;
  size_t n = 1;
  for (const MValue& item : v.as_list()) {
    n += value_size(item, limit);
    if (n > limit) break;
  }
  return n;
}

[[noreturn]] void too_big() {
  throw ExprError(cat("the value grows past ", kMaxValueSize, " elements and characters"));
}

}  // namespace

MValue checked_size(MValue v) {
  if (value_size(v, kMaxValueSize) > kMaxValueSize) too_big();
  return v;
}

std::string MValue::repr() const {
  return abbreviate(written(*this));
}

std::string MValue::text() const {
  if (is_int()) return std::to_string(as_int());
  if (is_bool()) return as_bool() ? "true" : "false";
  if (is_string()) return as_string();
  if (is_list()) return written(*this);
  std::ostringstream os;
  os << as_float();
  return os.str();
}

bool MValue::operator==(const MValue& o) const {
  if (is_number() && o.is_number()) return as_float() == o.as_float();
  return v == o.v;
}

const MValue* Env::find(const std::string& name) const {
  for (auto f = frames_.rbegin(); f != frames_.rend(); ++f) {
    auto it = f->find(name);
    if (it != f->end()) return &it->second;
  }
  return nullptr;
}

std::vector<std::string> Env::names() const {
  std::set<std::string> all;
  for (const auto& f : frames_)
    for (const auto& [k, v] : f) all.insert(k);
  return {all.begin(), all.end()};
}

namespace {

// ---- tokens ----

enum class Tok { number, string, name, op, end };

struct Token {
  Tok kind;
  std::string text;
  MValue value;  // number and string literals
};

std::vector<Token> tokenize(const std::string& s) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (std::isdigit(static_cast<unsigned char>(c)) ||
               (c == '.' && i + 1 < s.size() && std::isdigit(s[i + 1]))) {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '.' ||
                              ((s[j] == '+' || s[j] == '-') && (s[j - 1] == 'e' || s[j - 1] == 'E'))))
        ++j;
      const std::string t = s.substr(i, j - i);
      const bool is_float = t.find_first_of(".eE") != std::string::npos;
      size_t used = 0;
      Token tok{Tok::number, t, {}};
      try {
        tok.value =
            is_float ? MValue(std::stod(t, &used)) : MValue(static_cast<int64_t>(std::stoll(t, &used)));
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != t.size()) throw ExprError(cat("bad number '", t, "'"));
      out.push_back(tok);
      i = j;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Tok::name, s.substr(i, j - i), {}});
      i = j;
    } else if (c == '\'' || c == '"') {
      const size_t j = s.find(c, i + 1);
      if (j == std::string::npos) throw ExprError("unterminated string");
      out.push_back({Tok::string, s.substr(i, j - i + 1), MValue(s.substr(i + 1, j - i - 1))});
      i = j + 1;
    } else {
      static const char* two[] = {"//", "==", "!=", "<=", ">="};
      std::string op(1, c);
      for (const char* t : two)
        if (s.compare(i, 2, t) == 0) op = t;
      if (op.size() == 1 && std::string("+-*/%()[],<>").find(c) == std::string::npos)
        throw ExprError(cat("unexpected character '", c, "'"));
      out.push_back({Tok::op, op, {}});
      i += op.size();
    }
  }
  out.push_back({Tok::end, "end of expression", {}});
  return out;
}

// ---- syntax tree ----

struct Ex {
  enum Kind { literal, name, unary, binary, call, index, list, cond } kind;
  std::string op;  // operator, name or function
  MValue value;    // literal
  std::vector<std::unique_ptr<Ex>> kids;
};
using ExPtr = std::unique_ptr<Ex>;

ExPtr node(Ex::Kind k, std::string op, std::vector<ExPtr> kids = {}) {
  auto e = std::make_unique<Ex>();
  e->kind = k;
  e->op = std::move(op);
  e->kids = std::move(kids);
  return e;
}

std::vector<ExPtr> two(ExPtr a, ExPtr b) {
  std::vector<ExPtr> v;
  v.push_back(std::move(a));
  v.push_back(std::move(b));
  return v;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> t) : t_(std::move(t)) {}

  ExPtr parse() {
    ExPtr e = conditional();
    if (peek().kind != Tok::end) throw ExprError(cat("unexpected '", peek().text, "'"));
    return e;
  }

 private:
  const Token& peek() const { return t_[pos_]; }
  bool at(const std::string& text) const {
    return (peek().kind == Tok::op || peek().kind == Tok::name) && peek().text == text;
  }
  bool accept(const std::string& text) {
    if (!at(text)) return false;
    ++pos_;
    return true;
  }
  void expect(const std::string& text) {
    if (!accept(text)) throw ExprError(cat("expected '", text, "', got '", peek().text, "'"));
  }

  ExPtr conditional() {
    ExPtr a = logical_or();
    if (!accept("if")) return a;
    ExPtr c = logical_or();
    expect("else");
    std::vector<ExPtr> k;
    k.push_back(std::move(c));
    k.push_back(std::move(a));
    k.push_back(conditional());
    return node(Ex::cond, "if", std::move(k));
  }
  ExPtr logical_or() {
    ExPtr a = logical_and();
    while (accept("or")) a = node(Ex::binary, "or", two(std::move(a), logical_and()));
    return a;
  }
  ExPtr logical_and() {
    ExPtr a = logical_not();
    while (accept("and")) a = node(Ex::binary, "and", two(std::move(a), logical_not()));
    return a;
  }
  ExPtr logical_not() {
    if (!accept("not")) return comparison();
    std::vector<ExPtr> k;
    k.push_back(logical_not());
    return node(Ex::unary, "not", std::move(k));
  }
  ExPtr comparison() {
    ExPtr a = sum();
    for (const char* op : {"==", "!=", "<=", ">=", "<", ">"})
      if (accept(op)) return node(Ex::binary, op, two(std::move(a), sum()));
    return a;
  }
  ExPtr sum() {
    ExPtr a = term();
    for (;;) {
      const std::string op = peek().text;
      if (!accept("+") && !accept("-")) return a;
      a = node(Ex::binary, op, two(std::move(a), term()));
    }
  }
  ExPtr term() {
    ExPtr a = unary();
    for (;;) {
      const std::string op = peek().text;
      if (!accept("*") && !accept("//") && !accept("/") && !accept("%")) return a;
      a = node(Ex::binary, op, two(std::move(a), unary()));
    }
  }
  ExPtr unary() {
    if (!accept("-")) return postfix();
    std::vector<ExPtr> k;
    k.push_back(unary());
    return node(Ex::unary, "-", std::move(k));
  }
  ExPtr postfix() {
    ExPtr a = primary();
    while (accept("[")) {
      a = node(Ex::index, "[]", two(std::move(a), conditional()));
      expect("]");
    }
    return a;
  }
  std::vector<ExPtr> items(const std::string& close) {
    std::vector<ExPtr> k;
    if (accept(close)) return k;
    do k.push_back(conditional());
    while (accept(","));
    expect(close);
    return k;
  }
  ExPtr primary() {
    const Token tok = peek();
    if (tok.kind == Tok::number || tok.kind == Tok::string) {
      ++pos_;
      ExPtr e = node(Ex::literal, "");
      e->value = tok.value;
      return e;
    }
    if (accept("(")) {
      ExPtr e = conditional();
      expect(")");
      return e;
    }
    if (accept("[")) return node(Ex::list, "[]", items("]"));
    if (tok.kind != Tok::name) throw ExprError(cat("unexpected '", tok.text, "'"));
    ++pos_;
    if (tok.text == "true" || tok.text == "false") {
      ExPtr e = node(Ex::literal, "");
      e->value = MValue(tok.text == "true");
      return e;
    }
    if (accept("(")) return node(Ex::call, tok.text, items(")"));
    return node(Ex::name, tok.text);
  }

  std::vector<Token> t_;
  size_t pos_ = 0;
};

// ---- evaluation ----

class Evaluator {
 public:
  explicit Evaluator(const Env& env) : env_(env) {}

  MValue eval(const Ex& e) const {
    switch (e.kind) {
      case Ex::literal:
        return e.value;
      case Ex::name:
        return lookup(e.op);
      case Ex::unary:
        return unary(e.op, eval(*e.kids[0]));
      case Ex::binary:
        return binary(e);
      case Ex::call:
        return call(e);
      case Ex::index:
        return index(eval(*e.kids[0]), eval(*e.kids[1]));
      case Ex::list: {
        MValue::List l;
        for (const auto& k : e.kids) l.push_back(eval(*k));
        return checked_size(MValue(std::move(l)));
      }
      case Ex::cond:
        return boolean(eval(*e.kids[0]), "if") ? eval(*e.kids[1]) : eval(*e.kids[2]);
    }
    throw ExprError("unknown expression");
  }

 private:
  MValue lookup(const std::string& name) const {
    if (const MValue* v = env_.find(name)) return *v;
    const std::string near = closest_match(name, env_.names());
    throw ExprError(
        cat("unknown name '", name, "'", near.empty() ? "" : cat(" (did you mean '", near, "'?)")));
  }

  static bool boolean(const MValue& v, const std::string& op) {
    if (!v.is_bool())
      throw ExprError(cat("'", op, "' needs a boolean, got ", v.repr(), " (", v.type_name(), ")"));
    return v.as_bool();
  }

  static MValue unary(const std::string& op, const MValue& a) {
    if (op == "not") return MValue(!boolean(a, op));
    if (a.is_int() && a.as_int() == std::numeric_limits<int64_t>::min())
      throw ExprError(cat("-", a.as_int(), " overflows a 64-bit integer"));
    if (a.is_int()) return MValue(-a.as_int());
    if (a.is_float()) return MValue(-a.as_float());
    throw ExprError(cat("cannot negate ", a.repr(), " (", a.type_name(), ")"));
  }

  MValue binary(const Ex& e) const {
    const MValue a = eval(*e.kids[0]);
    if (e.op == "and") return MValue(boolean(a, "and") && boolean(eval(*e.kids[1]), "and"));
    if (e.op == "or") return MValue(boolean(a, "or") || boolean(eval(*e.kids[1]), "or"));
    return arith(e.op, a, eval(*e.kids[1]));
  }

  static MValue compare(const std::string& op, const MValue& a, const MValue& b) {
    if (op == "==") return MValue(a == b);
    if (op == "!=") return MValue(!(a == b));
    int c;
    if (a.is_number() && b.is_number())
      c = a.as_float() < b.as_float() ? -1 : (a.as_float() > b.as_float() ? 1 : 0);
    else if (a.is_string() && b.is_string())
      c = a.as_string().compare(b.as_string());
    else
      throw ExprError(cat("cannot compare ", a.repr(), " and ", b.repr()));
    if (op == "<") return MValue(c < 0);
    if (op == "<=") return MValue(c <= 0);
    if (op == ">") return MValue(c > 0);
    return MValue(c >= 0);
  }

  static MValue arith(const std::string& op, const MValue& a, const MValue& b) {
    if (op == "==" || op == "!=" || op == "<" || op == "<=" || op == ">" || op == ">=")
      return compare(op, a, b);
    // Sizes are checked before anything is built.
    if (op == "+" && a.is_string() && b.is_string()) {
      if (a.as_string().size() + b.as_string().size() > kMaxValueSize) too_big();
      return MValue(a.as_string() + b.as_string());
    }
    if (op == "+" && a.is_list() && b.is_list()) {
      if (1 + value_size(a, kMaxValueSize) + value_size(b, kMaxValueSize) > kMaxValueSize) too_big();
      MValue::List l = a.as_list();
      l.insert(l.end(), b.as_list().begin(), b.as_list().end());
      return MValue(std::move(l));
    }
    if (op == "*" && a.is_list() && b.is_int()) {
      const size_t each = value_size(a, kMaxValueSize);
      if (b.as_int() > 0 &&
          (each > kMaxValueSize || static_cast<uint64_t>(b.as_int()) > kMaxValueSize / each))
        too_big();
      MValue::List l;
      for (int64_t r = 0; r < b.as_int(); ++r) l.insert(l.end(), a.as_list().begin(), a.as_list().end());
      return MValue(std::move(l));
    }
    if (!a.is_number() || !b.is_number())
      throw ExprError(cat("cannot apply '", op, "' to ", a.repr(), " (", a.type_name(), ") and ", b.repr(),
                          " (", b.type_name(), ")"));
    if ((op == "/" || op == "//" || op == "%") && b.as_float() == 0.0) throw ExprError("division by zero");
    if (a.is_int() && b.is_int() && op != "/") return int_arith(op, a.as_int(), b.as_int());
    const double x = a.as_float(), y = b.as_float();
    if (op == "+") return MValue(x + y);
    if (op == "-") return MValue(x - y);
    if (op == "*") return MValue(x * y);
    if (op == "/") return MValue(x / y);
    if (op == "//") return MValue(std::floor(x / y));
    return MValue(x - y * std::floor(x / y));  // Python's %: the sign of the divisor
  }

  static MValue int_arith(const std::string& op, int64_t x, int64_t y) {
    int64_t r = 0;
    const bool overflow = op == "+"   ? __builtin_add_overflow(x, y, &r)
                          : op == "-" ? __builtin_sub_overflow(x, y, &r)
                          : op == "*" ? __builtin_mul_overflow(x, y, &r)
                                      : x == std::numeric_limits<int64_t>::min() && y == -1;
    if (overflow) throw ExprError(cat(x, " ", op, " ", y, " overflows a 64-bit integer"));
    if (op == "+" || op == "-" || op == "*") return MValue(r);
    // Floor division and modulo as in Python (rounding toward minus infinity).
    int64_t q = x / y;
    r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) --q, r += y;
    return op == "//" ? MValue(q) : MValue(r);
  }

  static MValue index(const MValue& list, const MValue& i) {
    if (!list.is_list()) throw ExprError(cat("cannot index ", list.repr(), " (", list.type_name(), ")"));
    if (!i.is_int()) throw ExprError(cat("list index must be an integer, got ", i.repr()));
    const int64_t n = static_cast<int64_t>(list.as_list().size());
    const int64_t k = i.as_int() < 0 ? i.as_int() + n : i.as_int();
    if (k < 0 || k >= n) throw ExprError(cat("index ", i.as_int(), " out of range for a list of ", n));
    return list.as_list()[static_cast<size_t>(k)];
  }

  MValue call(const Ex& e) const {
    std::vector<MValue> args;
    for (const auto& k : e.kids) args.push_back(eval(*k));
    if (e.op == "len") {
      if (args.size() != 1 || !(args[0].is_list() || args[0].is_string()))
        throw ExprError("len() takes one list or string");
      return MValue(
          static_cast<int64_t>(args[0].is_list() ? args[0].as_list().size() : args[0].as_string().size()));
    }
    if (e.op == "range") {
      if (args.empty() || args.size() > 2 ||
          !std::all_of(args.begin(), args.end(), [](auto& a) { return a.is_int(); }))
        throw ExprError("range() takes one or two integers");
      MValue::List l;
      const int64_t lo = args.size() == 2 ? args[0].as_int() : 0, hi = args.back().as_int();
      // hi - lo as unsigned: it may exceed int64.
      if (hi > lo && static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) >= kMaxValueSize)
        throw ExprError(cat("range(", lo, ", ", hi, ") grows past ", kMaxValueSize, " elements"));
      for (int64_t k = lo; k < hi; ++k) l.emplace_back(k);
      return MValue(std::move(l));
    }
    if (e.op == "min" || e.op == "max") {
      if (args.size() == 1 && args[0].is_list()) args = args[0].as_list();
      if (args.empty()) throw ExprError(cat(e.op, "() of nothing"));
      MValue best = args[0];
      for (const MValue& a : args)
        if (compare(e.op == "min" ? "<" : ">", a, best).as_bool()) best = a;
      return best;
    }
    const std::string near = closest_match(e.op, {"len", "range", "min", "max"});
    throw ExprError(
        cat("unknown function '", e.op, "'", near.empty() ? "" : cat(" (did you mean '", near, "'?)")));
  }

  const Env& env_;
};

}  // namespace

MValue eval_expr(const std::string& text, const Env& env) {
  Parser p(tokenize(text));
  const ExPtr tree = p.parse();
  return Evaluator(env).eval(*tree);
}

}  // namespace flowrun::nn
