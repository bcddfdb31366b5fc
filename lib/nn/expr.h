// Values of model files (int, float, bool, string, list) and the `${expr}` evaluator over named values.
// Internal to lib/nn.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace flowrun::nn {

struct MValue {
  using List = std::vector<MValue>;
  std::variant<int64_t, double, bool, std::string, List> v;

  MValue() : v(int64_t{0}) {}
  MValue(int64_t x) : v(x) {}
  MValue(double x) : v(x) {}
  MValue(bool x) : v(x) {}
  MValue(std::string x) : v(std::move(x)) {}
  MValue(List x) : v(std::move(x)) {}

  bool is_int() const { return std::holds_alternative<int64_t>(v); }
  bool is_float() const { return std::holds_alternative<double>(v); }
  bool is_bool() const { return std::holds_alternative<bool>(v); }
  bool is_string() const { return std::holds_alternative<std::string>(v); }
  bool is_list() const { return std::holds_alternative<List>(v); }
  bool is_number() const { return is_int() || is_float(); }
  int64_t as_int() const { return std::get<int64_t>(v); }
  double as_float() const { return is_int() ? static_cast<double>(as_int()) : std::get<double>(v); }
  bool as_bool() const { return std::get<bool>(v); }
  const std::string& as_string() const { return std::get<std::string>(v); }
  const List& as_list() const { return std::get<List>(v); }

  const char* type_name() const;  // "integer", "number", "boolean", "string", "list"
  std::string repr() const;       // for messages: as written in an expression (3, 0.5, 'relu', [1, 2]),
                                  // cut to about 60 characters
  std::string text() const;       // as interpolated into a string: strings without quotes
  bool operator==(const MValue& o) const;
};

// A failed evaluation; the loader adds the file position and key path.
class ExprError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Nested frames of names (model parameters, then loop variables); inner frames shadow outer ones.
class Env {
 public:
  Env() : frames_(1) {}
  void push() { frames_.emplace_back(); }
  void pop() { frames_.pop_back(); }
  void set(const std::string& name, MValue v) { frames_.back()[name] = std::move(v); }
  const MValue* find(const std::string& name) const;
  std::vector<std::string> names() const;  // every visible name, sorted

 private:
  std::vector<std::map<std::string, MValue>> frames_;
};

// Evaluates one expression (the text between `${` and `}`); throws ExprError, also when integer arithmetic
// overflows int64 or a value grows past kMaxValueSize.
MValue eval_expr(const std::string& text, const Env& env);

// The most a value may hold, counting every number, boolean, list and string character (nested lists in
// full): far beyond any layer option, it stops `[0] * n` or `let` chains that double a list from
// exhausting memory.
constexpr size_t kMaxValueSize = size_t{1} << 20;
// `v` itself; throws ExprError when it holds more than kMaxValueSize.
MValue checked_size(MValue v);

}  // namespace flowrun::nn
