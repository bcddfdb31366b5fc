// Model-file plumbing: quoting `${...}` for YAML flow collections, positions in messages, typed values of
// YAML nodes, and the option accessors layers validate their options through.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "nn/loader.h"
#include "ops/registry.h"

namespace flowrun {

namespace {

// Whether `${` at column i starts a whole scalar: only spaces back to a YAML indicator or the line start.
bool starts_scalar(const std::string& line, size_t i) {
  size_t j = i;
  while (j > 0 && line[j - 1] == ' ') --j;
  return j == 0 || std::string(":-[{,?").find(line[j - 1]) != std::string::npos;
}

// End (index of the closing '}') of the expression opened at i, skipping quoted strings; npos if none.
size_t expression_end(const std::string& line, size_t i) {
  char quote = 0;
  for (size_t j = i + 2; j < line.size(); ++j) {
    if (quote) {
      if (line[j] == quote) quote = 0;
    } else if (line[j] == '\'' || line[j] == '"') {
      quote = line[j];
    } else if (line[j] == '}') {
      return j;
    }
  }
  return std::string::npos;
}

// Whether the scalar ends right after column j (so the expression is the whole scalar).
bool ends_scalar(const std::string& line, size_t j) {
  size_t k = j + 1;
  while (k < line.size() && line[k] == ' ') ++k;
  return k == line.size() || std::string(",]}#").find(line[k]) != std::string::npos;
}

std::string quote_line(const std::string& line, std::vector<int>* inserted) {
  std::string out;
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = starts_scalar(line, i) ? c : 0;  // an apostrophe inside a plain scalar opens nothing
    } else if (c == '#' && (i == 0 || line[i - 1] == ' ')) {
      return out + line.substr(i);
    } else if (c == '$' && i + 1 < line.size() && line[i + 1] == '{' && starts_scalar(line, i)) {
      const size_t end = expression_end(line, i);
      const std::string expr = end == std::string::npos ? "" : line.substr(i, end - i + 1);
      const char q = expr.find('"') == std::string::npos ? '"' : '\'';
      if (!expr.empty() && ends_scalar(line, end) && expr.find(q) == std::string::npos) {
        if (inserted) {
          inserted->push_back(static_cast<int>(out.size()));
          inserted->push_back(static_cast<int>(out.size() + expr.size() + 1));
        }
        out += cat(q, expr, q);
        i = end;
        continue;
      }
    }
    out += c;
  }
  return out;
}

}  // namespace

std::string quote_expressions(const std::string& text, std::map<int, std::vector<int>>* inserted) {
  std::string out;
  size_t start = 0;
  for (int line = 0; start <= text.size(); ++line) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::vector<int> cols;
    out += quote_line(text.substr(start, end - start), &cols);
    if (!cols.empty() && inserted) (*inserted)[line] = cols;
    if (end == text.size()) break;
    out += '\n';
    start = end + 1;
  }
  return out;
}

namespace nn {

std::string Source::at(const YAML::Mark& m) const {
  if (!fixed.empty()) return fixed;
  if (m.line < 0) return file;
  int col = m.column;
  auto it = inserted.find(m.line);
  if (it != inserted.end())
    col -= static_cast<int>(
        std::count_if(it->second.begin(), it->second.end(), [&](int c) { return c < m.column; }));
  return cat(file, ":", m.line + 1, ":", col + 1);
}

void fail(const Source& src, const YAML::Node& at, const std::string& path, const std::string& msg) {
  const YAML::Mark m = at.IsDefined() ? at.Mark() : YAML::Mark::null_mark();
  const std::string loc = src.at(m);
  throw LocatedError(cat(loc, loc.empty() ? "" : ": ", src.path_prefix, path, ": ", msg));
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string near = closest_match(word, candidates);
  return near.empty() ? "" : cat(" (did you mean '", near, "'?)");
}

namespace {

// A plain YAML scalar typed as YAML 1.2's core schema does: integer, float, boolean, else string. An
// integer or float beyond what int64 / double hold is an ExprError (strtoll and strtod would saturate).
MValue plain_scalar(const std::string& s) {
  if (s.empty()) return MValue(s);
  char* end = nullptr;
  errno = 0;
  const long long i = std::strtoll(s.c_str(), &end, 10);
  if (*end == '\0' && std::isdigit(static_cast<unsigned char>(s.back()))) {
    if (errno == ERANGE)
      throw ExprError(cat("the integer ", abbreviate(s), " is out of range (-2^63 to 2^63-1)"));
    return MValue(static_cast<int64_t>(i));
  }
  const double d = std::strtod(s.c_str(), &end);
  if (*end == '\0' && s.find_first_of("0123456789") != std::string::npos &&
      s.find_first_of("xX") == std::string::npos) {
    if (std::isinf(d)) throw ExprError(cat("the number ", abbreviate(s), " is out of range"));
    return MValue(d);
  }
  if (s == "true" || s == "True" || s == "TRUE") return MValue(true);
  if (s == "false" || s == "False" || s == "FALSE") return MValue(false);
  return MValue(s);
}

// "a${x}b" with each expression replaced by its text.
std::string interpolate(const std::string& s, const Env& env) {
  std::string out;
  size_t pos = 0;
  for (;;) {
    const size_t open = s.find("${", pos);
    if (open == std::string::npos) return out + s.substr(pos);
    const size_t close = s.find('}', open);
    if (close == std::string::npos) throw ExprError("'${' without a closing '}'");
    out += s.substr(pos, open - pos) + eval_expr(s.substr(open + 2, close - open - 2), env).text();
    pos = close + 1;
  }
}

}  // namespace

MValue to_value(const YAML::Node& n, const Env& env, const Source& src, const std::string& path) {
  if (!n.IsDefined() || n.IsNull()) fail(src, n, path, "missing value");
  if (n.IsMap()) fail(src, n, path, "expected a value, got a map");
  if (n.IsSequence()) {
    MValue::List l;
    for (size_t i = 0; i < n.size(); ++i) l.push_back(to_value(n[i], env, src, cat(path, "[", i, "]")));
    return MValue(std::move(l));
  }
  const std::string& s = n.Scalar();
  try {
    const size_t close = s.find('}');
    if (s.rfind("${", 0) == 0 && close == s.size() - 1) return eval_expr(s.substr(2, s.size() - 3), env);
    if (s.find("${") != std::string::npos) return checked_size(MValue(interpolate(s, env)));
    return written_as_string(n) ? MValue(s) : plain_scalar(s);
  } catch (const ExprError& e) {
    fail(src, n, path, e.what());
  }
}

// ---- Opts ----

Opts::Opts(Ctx& ctx, const YAML::Node& map, const std::string& path, const LayerDef& def)
    : ctx_(ctx), map_(map), path_(path) {
  if (!map.IsDefined() || map.IsNull()) return;
  if (!map.IsMap())
    nn::fail(ctx.src, map, path,
             cat("options of '", def.type, "' must be a map, got '", abbreviate(map.Scalar()), "'"));
  std::vector<std::string> known = def.options;
  known.push_back("name");
  known.push_back("recompute");
  for (const auto& kv : map) {
    const std::string key = kv.first.Scalar();
    if (std::find(known.begin(), known.end(), key) == known.end())
      nn::fail(ctx.src, kv.first, cat(path, ".", abbreviate(key)),
               cat("unknown option of ", def.type, did_you_mean(key, known), "; its options: ", join(known)));
  }
}

void Opts::fail(const std::string& key, const std::string& msg) const {
  nn::fail(ctx_.src, node(key), path(key), msg);
}

MValue Opts::value(const std::string& key) const {
  if (!has(key))
    nn::fail(ctx_.src, map_.IsDefined() && !map_.IsNull() ? map_ : (ctx_.cur_node ? *ctx_.cur_node : map_),
             path(key), "missing required option");
  return to_value(map_[key], ctx_.env, ctx_.src, path(key));
}

int64_t Opts::integer(const std::string& key, std::optional<int64_t> dflt, int64_t min) const {
  if (!has(key) && dflt) return *dflt;
  const MValue v = value(key);
  // An integral float (e.g. d_model / heads) is accepted as the integer it equals.
  const bool integral =
      v.is_float() && std::floor(v.as_float()) == v.as_float() && std::abs(v.as_float()) < 9e15;
  if (!v.is_int() && !integral)
    fail(key, cat("expected an integer, got ", v.repr(), " (", v.type_name(), ")"));
  const int64_t i = v.is_int() ? v.as_int() : static_cast<int64_t>(v.as_float());
  if (i < min) fail(key, cat("must be >= ", min, ", got ", i));
  return i;
}

double Opts::number(const std::string& key, std::optional<double> dflt) const {
  if (!has(key) && dflt) return *dflt;
  const MValue v = value(key);
  if (!v.is_number()) fail(key, cat("expected a number, got ", v.repr(), " (", v.type_name(), ")"));
  return v.as_float();
}

double Opts::probability(const std::string& key, double dflt) const {
  const double p = number(key, dflt);
  if (!(p >= 0.0 && p < 1.0)) fail(key, cat("must be in [0, 1), got ", p));
  return p;
}

bool Opts::flag(const std::string& key, bool dflt) const {
  if (!has(key)) return dflt;
  const MValue v = value(key);
  if (!v.is_bool()) fail(key, cat("expected true or false, got ", v.repr(), " (", v.type_name(), ")"));
  return v.as_bool();
}

std::string Opts::text(const std::string& key, std::optional<std::string> dflt) const {
  if (!has(key) && dflt) return *dflt;
  const MValue v = value(key);
  if (v.is_list()) fail(key, cat("expected a name, got ", v.repr()));
  return v.text();
}

std::string Opts::choice(const std::string& key, const std::string& dflt,
                         const std::vector<std::string>& choices) const {
  const std::string s = text(key, dflt);
  if (std::find(choices.begin(), choices.end(), s) != choices.end()) return s;
  std::string list;
  for (const auto& c : choices) list += cat(list.empty() ? "" : ", ", c);
  fail(key, cat("expected one of ", list, ", got '", abbreviate(s), "'", did_you_mean(s, choices)));
}

std::vector<int64_t> Opts::pair(const std::string& key, std::optional<int64_t> dflt, int64_t min) const {
  if (!has(key) && dflt) return {*dflt, *dflt};
  const MValue v = value(key);
  std::vector<int64_t> out;
  if (v.is_int()) out = {v.as_int(), v.as_int()};
  if (v.is_list() && v.as_list().size() == 2 && v.as_list()[0].is_int() && v.as_list()[1].is_int())
    out = {v.as_list()[0].as_int(), v.as_list()[1].as_int()};
  if (out.empty()) fail(key, cat("expected an integer or a list of 2 integers, got ", v.repr()));
  if (out[0] < min || out[1] < min) fail(key, cat("must be >= ", min, ", got ", v.repr()));
  return out;
}

YAML::Node Opts::layers(const std::string& key, bool required) const {
  if (!has(key)) {
    if (required) value(key);
    return YAML::Node(YAML::NodeType::Sequence);
  }
  const YAML::Node n = map_[key];
  if (!n.IsSequence()) fail(key, "expected a list of layers");
  return n;
}

std::optional<InitSpec> Opts::init() const {
  if (!has("init")) return std::nullopt;
  const YAML::Node n = map_["init"];
  if (!n.IsMap()) fail("init", "expected a map like {kind: normal, std: 0.02}");
  const LayerDef spec{"init", {"kind", "mean", "std", "low", "high"}, "", false, nullptr};
  const Opts o(ctx_, n, path("init"), spec);
  InitSpec s;
  s.kind = o.choice("kind", "", {"zeros", "ones", "normal", "uniform", "trunc_normal"});
  if (s.kind == "normal" || s.kind == "trunc_normal") {
    s.a = o.number("mean", 0.0);
    s.b = o.number("std");
    if (s.b <= 0) o.fail("std", "must be > 0");
  } else if (s.kind == "uniform") {
    s.a = o.number("low");
    s.b = o.number("high");
    if (s.b <= s.a) o.fail("high", "must be > low");
  }
  return s;
}

// ---- parameters ----

std::optional<int64_t> checked_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return std::nullopt;
  return n;
}

void Ctx::check_size(const std::string& what, const Shape& shape) const {
  const std::optional<int64_t> n = checked_numel(shape);
  if (!n || *n > kMaxElements)
    fail(cat(what, " of shape ", shape_str(shape), " is too large (more than 2^48 elements)"));
}

ValueId Ctx::param(const std::string& local, const Shape& shape, ParamInfo info) {
  const std::string full = b.scoped(local);
  if (params.count(full)) fail(cat("parameter '", full, "' already exists: give this layer another name"));
  check_size(cat("the parameter '", full, "'"), shape);
  num_params += numel(shape);  // both at most 2^48: no overflow
  if (num_params > kMaxElements)
    fail(cat("the model has more than 2^48 parameters (at '", full, "' of shape ", shape_str(shape), ")"));
  params[full] = std::move(info);
  trainable.insert(full);
  return b.param(local, shape);
}

ValueId Ctx::state(const std::string& local, const Shape& shape, ParamInfo info) {
  const std::string full = b.scoped(local);
  if (params.count(full)) fail(cat("state '", full, "' already exists: give this layer another name"));
  check_size(cat("the state '", full, "'"), shape);
  params[full] = std::move(info);
  return b.state(local, shape);
}

}  // namespace nn
}  // namespace flowrun
