// The layer registry of model files: each layer type, its options and the graph nodes it adds; plus the
// generic layer-entry parsing and scoping (build_layer / build_layers).
#include <cmath>
#include <limits>

#include "nn/loader.h"

namespace flowrun::nn {

namespace {

// Pushes a name scope (and a fresh counter frame) for the lifetime of the object.
class Scope {
 public:
  Scope(Ctx& c, const std::string& s) : c_(c), active_(!s.empty()) {
    if (active_) c_.push_scope(s);
  }
  ~Scope() {
    if (active_) c_.pop_scope();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  Ctx& c_;
  bool active_;
};

Shape shape_of(Ctx& c, ValueId x) {
  return c.b.shape(x);
}

void need_rank(Ctx& c, ValueId x, size_t rank, const std::string& layer, const std::string& what) {
  if (shape_of(c, x).size() != rank)
    c.fail(cat(layer, " needs a ", what, " input, got shape ", shape_str(shape_of(c, x))));
}

void need_float(Ctx& c, ValueId x, const std::string& layer) {
  if (c.b.dtype(x) != DType::f32 && c.b.dtype(x) != DType::f64)
    c.fail(cat(layer, " needs a floating-point input, got ", dtype_name(c.b.dtype(x)),
               " (integer token ids go through an embedding first)"));
}

// y = x W^T + b over the last dim, with parameters "w" (out, in) and "b" (out) in the current scope.
ValueId dense(Ctx& c, ValueId x, int64_t out, bool bias, bool residual, std::optional<InitSpec> init) {
  need_float(c, x, "linear");
  const Shape s = shape_of(c, x);
  if (s.empty()) c.fail("linear needs an input of rank >= 1");
  const int64_t in = s.back();
  ParamInfo w{ParamInfo::weight, in, out, false, residual, init};
  std::vector<ValueId> inputs{x, c.param("w", {out, in}, w)};
  if (bias) inputs.push_back(c.param("b", {out}, ParamInfo::of(ParamInfo::bias, in, out)));
  return c.b.op1("linear", inputs);
}

// `sbp: {w: S(0), b: B}` on a layer: fixes how its parameters are laid out on the tensor axis instead of
// leaving it to SBP deduction (Placement::hint; graph/sbp_parallel.cc).
void apply_sbp(Ctx& c, const Opts& o) {
  if (!o.has("sbp")) return;
  const YAML::Node m = o.node("sbp");
  if (!m.IsMap()) o.fail("sbp", "expected a map from parameter name (w, b) to B or S(axis)");
  for (const auto& kv : m) {
    const std::string key = kv.first.as<std::string>();
    const ValueId v = c.b.graph().find_value(c.b.scoped(key));
    if (v == kNoValue || c.b.graph().value(v).kind != ValueKind::param)
      o.fail("sbp", cat("this layer has no parameter '", key, "'"));
    if (!kv.second.IsScalar()) o.fail("sbp", cat(key, ": expected B or S(axis)"));
    const std::string text = kv.second.as<std::string>();
    Value& p = c.b.graph().value(v);
    try {
      if (parse_sbp(text, p.shape().size(), key).kind == Sbp::P)
        o.fail("sbp", cat(key, ": a parameter cannot be P"));
    } catch (const Error& e) {
      o.fail("sbp", e.what());
    }
    p.placement.hint = text;
  }
}

// A fused projection of `groups` equal blocks (q|k|v): split over the tensor axis block by block.
void split_in_blocks(Ctx& c, ValueId y, int groups) {
  Graph& g = c.b.graph();
  for (ValueId in : g.node(g.value(y).producer).inputs)
    if (g.value(in).kind == ValueKind::param) g.value(in).placement.groups = groups;
}

ValueId dense_in(Ctx& c, const std::string& scope, ValueId x, int64_t out, bool bias, bool residual) {
  Scope s(c, scope);
  return dense(c, x, out, bias, residual, std::nullopt);
}

ValueId layernorm(Ctx& c, ValueId x, double eps) {
  need_float(c, x, "layernorm");
  const int64_t d = shape_of(c, x).back();
  const ValueId g = c.param("gamma", {d}, ParamInfo::of(ParamInfo::gamma));
  const ValueId b = c.param("beta", {d}, ParamInfo::of(ParamInfo::beta));
  return c.b.op("layernorm", {x, g, b}, {{"eps", eps}})[0];
}

ValueId rmsnorm(Ctx& c, ValueId x, double eps) {
  need_float(c, x, "rmsnorm");
  const ValueId g = c.param("gamma", {shape_of(c, x).back()}, ParamInfo::of(ParamInfo::gamma));
  return c.b.op("rmsnorm", {x, g}, {{"eps", eps}})[0];
}

ValueId dropout(Ctx& c, ValueId x, double p) {
  // Identity when it could not drop anything, so eval programs and p = 0 models carry no dropout node.
  if (p == 0.0 || !c.training) return x;
  return c.b.op("dropout", {x}, {{"p", p}})[0];
}

ValueId activation(Ctx& c, ValueId x, const std::string& type) {
  if (type == "none") return x;
  need_float(c, x, type);
  if (type == "gelu_tanh") return c.b.op1("gelu", {x}, {{"approximate", std::string("tanh")}});
  return c.b.op1(type, {x});
}

const std::vector<std::string> kActivations = {"none", "relu", "gelu", "tanh", "sigmoid", "silu"};

ValueId transpose12(Ctx& c, ValueId x) {
  return c.b.op1("transpose", {x}, {{"dim0", int64_t{1}}, {"dim1", int64_t{2}}});
}

// What an attention layer computes (its YAML options, shared by attention and transformer_block).
struct AttnSpec {
  int64_t heads = 1, kv_heads = 1;
  bool causal = true, bias = true, rope = false, separate = false;
  double dropout = 0.0, rope_theta = 10000.0;
  std::optional<int64_t> pad_id;
};

AttnSpec attn_spec(const Opts& o) {
  AttnSpec a;
  a.heads = o.integer("heads");
  a.kv_heads = o.integer("kv_heads", a.heads);
  if (a.heads % a.kv_heads != 0)
    o.fail("kv_heads", cat("must divide heads ", a.heads,
                           " (each key/value head serves a group of heads), got ", a.kv_heads));
  a.causal = o.flag("causal", true);
  a.dropout = o.probability("dropout", 0.0);
  a.bias = o.flag("bias", true);
  a.rope = o.flag("rope", false);
  a.rope_theta = o.number("rope_theta", 10000.0);
  if (a.rope_theta <= 1.0) o.fail("rope_theta", cat("must be > 1, got ", a.rope_theta));
  if (o.has("rope_theta") && !a.rope) o.fail("rope_theta", "is set but rope is false");
  a.separate = o.choice("qkv", "fused", {"fused", "separate"}) == "separate";
  if (o.has("pad_id")) a.pad_id = o.integer("pad_id", std::nullopt, 0);
  return a;
}

// Multi-head self-attention on (B, T, C): q, k, v projections (one fused `qkv` linear, or `q`, `k`, `v`),
// heads (B, H, T, D), rotary positions on q and k, k/v heads shared by groups of query heads, fused sdpa
// (with a key padding mask from the input ids), merge, output projection `proj`, residual dropout.
ValueId attention(Ctx& c, ValueId x, const AttnSpec& a, bool residual) {
  need_rank(c, x, 3, "attention", "(B, T, C)");
  const Shape s = shape_of(c, x);
  const int64_t B = s[0], T = s[1], C = s[2], H = a.heads, KV = a.kv_heads;
  if (C % H != 0) c.fail(cat("the model width ", C, " is not divisible by heads ", H));
  if (C > std::numeric_limits<int64_t>::max() / 3) c.fail(cat("the model width ", C, " is too large"));
  const int64_t D = C / H, KD = KV * D;
  if (a.rope && D % 2 != 0)
    c.fail(cat("rope needs an even head dimension, got width ", C, " / heads ", H, " = ", D));
  ValueId q, k, v;
  if (a.separate) {
    q = dense_in(c, "q", x, C, a.bias, false);
    k = dense_in(c, "k", x, KD, a.bias, false);
    v = dense_in(c, "v", x, KD, a.bias, false);
  } else {
    const ValueId qkv = dense_in(c, "qkv", x, C + 2 * KD, a.bias, false);
    // Three equal blocks split over the tensor axis block by block; with fewer k/v heads the blocks
    // differ and the fused weight stays whole there (`qkv: separate` splits each projection).
    if (KV == H) split_in_blocks(c, qkv, 3);
    const std::vector<ValueId> parts =
        c.b.op("split", {qkv}, {{"axis", int64_t{-1}}, {"sizes", std::vector<int64_t>{C, KD, KD}}});
    q = parts[0], k = parts[1], v = parts[2];
  }
  auto split_heads = [&](ValueId t, int64_t n) { return transpose12(c, c.b.reshape(t, {B, T, n, D})); };
  q = split_heads(q, H), k = split_heads(k, KV), v = split_heads(v, KV);
  if (a.rope) {
    // Decoding: the rows sit at the run-time position onwards.
    auto rotate = [&](ValueId t) {
      std::vector<ValueId> in{t};
      if (c.position != kNoValue) in.push_back(c.position);
      return c.b.op1("rope", in, {{"theta", a.rope_theta}});
    };
    q = rotate(q), k = rotate(k);
  }
  ValueId att;
  if (c.position != kNoValue) {
    // Decoding: k and v of the new positions join this layer's cache, which every later step reads.
    if (!a.causal || a.pad_id) c.fail("generation needs causal attention without pad_id (a decoder)");
    // The caches hold the KV key/value heads; sdpa_cache maps each query head to its group's.
    const Shape kv_shape{B, KV, c.cache_len, D};
    const ValueId kc = c.state("k_cache", kv_shape, ParamInfo::of(ParamInfo::kv_cache));
    const ValueId vc = c.state("v_cache", kv_shape, ParamInfo::of(ParamInfo::kv_cache));
    att = c.b.op1("sdpa_cache", {q, k, v, kc, vc, c.position});
  } else {
    if (KV < H) {
      // Query head h reads key/value head h / (H / KV) (Hugging Face's repeat_kv): (B, KV, T, D) ->
      // (B, KV, 1, T, D) -> broadcast (B, KV, G, T, D) -> (B, H, T, D). The gradient of the broadcast sums
      // over each group.
      const int64_t G = H / KV;
      auto expand = [&](ValueId t) {
        const ValueId b =
            c.b.op1("broadcast_to", {c.b.reshape(t, {B, KV, 1, T, D})}, {{"shape", Shape{B, KV, G, T, D}}});
        return c.b.reshape(b, {B, H, T, D});
      };
      k = expand(k), v = expand(v);
    }
    std::vector<ValueId> in{q, k, v};
    Attrs attrs{{"causal", a.causal}};
    if (a.pad_id) {
      if (c.ids == kNoValue || c.b.shape(c.ids) != Shape{B, T})
        c.fail("pad_id needs the model's input token ids (B, T) (text data)");
      in.push_back(c.ids);
      attrs.set("pad_id", *a.pad_id);
    }
    att = c.b.op("sdpa", in, attrs)[0];
  }
  const ValueId merged = c.b.reshape(transpose12(c, att), {B, T, C});
  return dropout(c, dense_in(c, "proj", merged, C, a.bias, residual), a.dropout);
}

// ---- layers ----

ValueId linear_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  const ValueId y = dense(c, x, o.integer("out"), o.flag("bias", true), false, o.init());
  apply_sbp(c, o);
  return y;
}

ValueId conv2d_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  need_rank(c, x, 4, "conv2d", "(N, C, H, W)");
  need_float(c, x, "conv2d");
  const int64_t out = o.integer("out"), groups = o.integer("groups", 1), in = shape_of(c, x)[1];
  const std::vector<int64_t> k = o.pair("kernel", std::nullopt, 1);
  if (in % groups != 0 || out % groups != 0)
    o.fail("groups",
           cat("input channels ", in, " and out ", out, " must both be divisible by groups ", groups));
  const int64_t fan_in = in / groups * k[0] * k[1], fan_out = out * k[0] * k[1];
  std::vector<ValueId> inputs{
      x, c.param("w", {out, in / groups, k[0], k[1]},
                 ParamInfo::of(ParamInfo::weight, fan_in, fan_out, true, false, o.init()))};
  if (o.flag("bias", true))
    inputs.push_back(c.param("b", {out}, ParamInfo::of(ParamInfo::bias, fan_in, fan_out, true)));
  return c.b.op1(
      "conv2d", inputs,
      {{"stride", o.pair("stride", 1, 1)}, {"padding", o.pair("padding", 0, 0)}, {"groups", groups}});
}

ValueId batchnorm_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  need_float(c, x, "batchnorm");
  if (shape_of(c, x).size() < 2) c.fail("batchnorm needs an (N, C, ...) input");
  const int64_t ch = shape_of(c, x)[1];
  const double eps = o.number("eps", 1e-5), momentum = o.number("momentum", 0.1);
  if (eps <= 0) o.fail("eps", "must be > 0");
  if (momentum < 0 || momentum > 1) o.fail("momentum", "must be in [0, 1]");
  const ValueId g = c.param("gamma", {ch}, ParamInfo::of(ParamInfo::gamma));
  const ValueId b = c.param("beta", {ch}, ParamInfo::of(ParamInfo::beta));
  const ValueId mean = c.state("running_mean", {ch}, ParamInfo::of(ParamInfo::running_mean));
  const ValueId var = c.state("running_var", {ch}, ParamInfo::of(ParamInfo::running_var));
  return c.b.op("batchnorm", {x, g, b, mean, var},
                {{"eps", eps}, {"momentum", momentum}, {"training", c.training}})[0];
}

double positive_eps(const Opts& o, double dflt) {
  const double eps = o.number("eps", dflt);
  if (eps <= 0) o.fail("eps", "must be > 0");
  return eps;
}

ValueId layernorm_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  return layernorm(c, x, positive_eps(o, 1e-5));
}

ValueId rmsnorm_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  return rmsnorm(c, x, positive_eps(o, 1e-6));
}

ValueId pool(Ctx& c, const Opts& o, ValueId x, const std::string& op) {
  need_rank(c, x, 4, op, "(N, C, H, W)");
  need_float(c, x, op);
  const std::vector<int64_t> k = o.pair("kernel", std::nullopt, 1);
  Attrs a{{"kernel", k}, {"padding", o.pair("padding", 0, 0)}};
  a.set("stride", o.has("stride") ? o.pair("stride", std::nullopt, 1) : k);
  return c.b.op(op, {x}, a)[0];
}

ValueId maxpool_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  return pool(c, o, x, "maxpool2d");
}
ValueId avgpool_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  return pool(c, o, x, "avgpool2d");
}

ValueId global_avgpool_layer(Ctx& c, const Opts&, const std::string&, ValueId x) {
  need_rank(c, x, 4, "global_avgpool", "(N, C, H, W)");
  return c.b.op1("global_avgpool", {x});
}

ValueId flatten_layer(Ctx& c, const Opts&, const std::string&, ValueId x) {
  const Shape s = shape_of(c, x);
  if (s.size() <= 2) return x;
  return c.b.reshape(x, {s[0], numel(s) / s[0]});
}

ValueId dropout_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  return dropout(c, x, o.probability("p", 0.5));
}

ValueId gelu_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  need_float(c, x, "gelu");
  return c.b.op1("gelu", {x}, {{"approximate", o.choice("approximate", "none", {"none", "tanh"})}});
}

ValueId activation_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  const std::string kind = o.choice("kind", "", kActivations);
  return activation(c, x, kind);
}

ValueId embedding_layer(Ctx& c, const Opts& o, const std::string& name, ValueId x) {
  if (c.b.dtype(x) != DType::i64)
    c.fail(cat("embedding needs integer token ids (text data), got ", dtype_name(c.b.dtype(x))));
  const int64_t vocab = o.integer("vocab"), dim = o.integer("dim");
  const ValueId table =
      c.param("w", {vocab, dim}, ParamInfo::of(ParamInfo::embedding, dim, vocab, false, false, o.init()));
  c.embeddings[name] = table;
  const ValueId y = c.b.op1("embedding", {x, table});
  apply_sbp(c, o);
  return y;
}

ValueId pos_embedding_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  need_rank(c, x, 3, "pos_embedding", "(B, T, D)");
  const Shape s = shape_of(c, x);
  const int64_t max_len = o.integer("max_len"), dim = o.integer("dim");
  if (s[1] > max_len) o.fail("max_len", cat("is ", max_len, " but the sequence has ", s[1], " positions"));
  if (s[2] != dim) o.fail("dim", cat("is ", dim, " but the input has width ", s[2]));
  ValueId pos =
      c.param("w", {max_len, dim}, ParamInfo::of(ParamInfo::position, dim, max_len, false, false, o.init()));
  if (c.position != kNoValue) {
    // Decoding: the rows of the run-time position onwards (the generator keeps them inside the table).
    if (c.cache_len > max_len)
      o.fail("max_len",
             cat("is ", max_len, " but generation keeps a context of ", c.cache_len, " positions"));
    return c.b.add(x, c.b.op1("slice_at", {pos, c.position}, {{"axis", int64_t{0}}, {"length", s[1]}}));
  }
  if (s[1] < max_len)
    pos = c.b.op1("slice", {pos}, {{"axis", int64_t{0}}, {"start", int64_t{0}}, {"end", s[1]}});
  return c.b.add(x, pos);
}

ValueId attention_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  return attention(c, x, attn_spec(o), false);
}

ValueId norm_in(Ctx& c, const std::string& scope, ValueId x, bool rms, double eps) {
  Scope s(c, scope);
  return rms ? rmsnorm(c, x, eps) : layernorm(c, x, eps);
}

// A transformer block: GPT-2's pre-LN x + attn(ln1(x)), then x + mlp(ln2(x)); or BERT's post-LN
// x = ln1(x + attn(x)), x = ln2(x + mlp(x)). mlp = fc -> GELU -> proj, or SwiGLU down(silu(gate(x)) * up(x)).
ValueId transformer_block_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  need_rank(c, x, 3, "transformer_block", "(B, T, C)");
  const int64_t C = shape_of(c, x)[2];
  const AttnSpec a = attn_spec(o);
  const double ratio = o.number("mlp_ratio", 4.0), p = a.dropout;
  if (ratio <= 0) o.fail("mlp_ratio", "must be > 0");
  if (o.has("ffn") && o.has("mlp_ratio")) o.fail("ffn", "give either ffn or mlp_ratio, not both");
  // The hidden width must be an int64 (llround of a larger value is unspecified).
  if (ratio * static_cast<double>(C) >= 0x1p62)
    o.fail("mlp_ratio", cat("mlp_ratio x width ", C, " is too large"));
  const int64_t hidden = o.has("ffn") ? o.integer("ffn") : std::llround(ratio * static_cast<double>(C));
  const bool rms = o.choice("norm", "layernorm", {"layernorm", "rmsnorm"}) == "rmsnorm";
  const double eps = o.number("norm_eps", rms ? 1e-6 : 1e-5);
  if (eps <= 0) o.fail("norm_eps", "must be > 0");
  const std::string mlp = o.choice("mlp", "gelu_tanh", {"gelu", "gelu_tanh", "swiglu"});
  const bool post = o.flag("post_norm", false);
  ++c.transformer_blocks;
  auto attn = [&](ValueId h) {
    Scope s(c, "attn");
    return attention(c, h, a, true);
  };
  auto ffn = [&](ValueId h) {
    Scope s(c, "mlp");
    if (mlp == "swiglu") {
      const ValueId gate = activation(c, dense_in(c, "gate", h, hidden, a.bias, false), "silu");
      h = c.b.mul(gate, dense_in(c, "up", h, hidden, a.bias, false));
      return dropout(c, dense_in(c, "down", h, C, a.bias, true), p);
    }
    h = activation(c, dense_in(c, "fc", h, hidden, a.bias, false), mlp);
    return dropout(c, dense_in(c, "proj", h, C, a.bias, true), p);
  };
  if (post) {
    x = norm_in(c, "ln1", c.b.add(x, attn(x)), rms, eps);
    return norm_in(c, "ln2", c.b.add(x, ffn(x)), rms, eps);
  }
  x = c.b.add(x, attn(norm_in(c, "ln1", x, rms, eps)));
  return c.b.add(x, ffn(norm_in(c, "ln2", x, rms, eps)));
}

ValueId residual_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  const ValueId main = build_layers(c, o.layers("layers"), o.path("layers"), x, false);
  ValueId shortcut = x;
  if (o.has("shortcut")) {
    Scope s(c, "shortcut");
    shortcut = build_layers(c, o.layers("shortcut"), o.path("shortcut"), x, false);
  }
  if (shape_of(c, main) != shape_of(c, shortcut))
    c.fail(cat("the layers give ", shape_str(shape_of(c, main)), " but the shortcut gives ",
               shape_str(shape_of(c, shortcut)), ": add a `shortcut:` projection"));
  return activation(c, c.b.add(main, shortcut), o.choice("activation", "none", kActivations));
}

// Iteration `i` of a repeat/for: scope "<name>.<i>", `i` bound (and `as` for `for`).
ValueId iteration(Ctx& c, const Opts& o, const std::string& name, int64_t i, ValueId x,
                  const std::string& var = "", const MValue& item = {}) {
  c.env.push();
  c.env.set("i", MValue(i));
  if (!var.empty()) c.env.set(var, item);
  ValueId out;
  {
    Scope s(c, name.empty() ? std::to_string(i) : cat(name, ".", i));
    out = build_layers(c, o.layers("layers"), o.path("layers"), x, true);
  }
  c.env.pop();
  return out;
}

ValueId repeat_layer(Ctx& c, const Opts& o, const std::string& name, ValueId x) {
  const int64_t times = o.integer("times", std::nullopt, 0);
  for (int64_t i = 0; i < times; ++i) x = iteration(c, o, name, i, x);
  return x;
}

ValueId for_layer(Ctx& c, const Opts& o, const std::string& name, ValueId x) {
  const MValue each = o.value("each");
  if (!each.is_list()) o.fail("each", cat("expected a list, got ", each.repr()));
  const std::string var = o.text("as");
  if (var.empty() || !(std::isalpha(static_cast<unsigned char>(var[0])) || var[0] == '_'))
    o.fail("as", cat("expected a variable name, got '", var, "'"));
  for (size_t i = 0; i < each.as_list().size(); ++i)
    x = iteration(c, o, name, static_cast<int64_t>(i), x, var, each.as_list()[i]);
  return x;
}

ValueId if_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  const MValue cond = o.value("cond");
  if (!cond.is_bool()) o.fail("cond", cat("expected true or false, got ", cond.repr()));
  const std::string branch = cond.as_bool() ? "then" : "else";
  return build_layers(c, o.layers(branch, branch == "then"), o.path(branch), x, false);
}

ValueId save_layer(Ctx& c, const Opts& o, const std::string& name, ValueId x) {
  if (!o.has("name")) o.fail("name", "save needs a name");
  c.saved[name] = x;
  return x;
}

ValueId saved(Ctx& c, const Opts& o) {
  const std::string from = o.text("from");
  auto it = c.saved.find(from);
  if (it != c.saved.end()) return it->second;
  std::vector<std::string> names;
  std::string list;
  for (const auto& [k, v] : c.saved) names.push_back(k), list += cat(list.empty() ? "" : ", ", k);
  o.fail("from", cat("no saved value '", from, "'", did_you_mean(from, names),
                     list.empty() ? "; save one with `- save: {name: ...}`" : cat("; saved: ", list)));
}

ValueId add_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  const ValueId s = saved(c, o);
  if (shape_of(c, s) != shape_of(c, x))
    o.fail("from", cat("the saved value is ", shape_str(shape_of(c, s)), " but the input is ",
                       shape_str(shape_of(c, x))));
  return c.b.add(x, s);
}

ValueId concat_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  const ValueId s = saved(c, o);
  const MValue axis = o.has("axis") ? o.value("axis") : MValue(int64_t{1});
  if (!axis.is_int()) o.fail("axis", cat("expected an integer, got ", axis.repr()));
  return c.b.op1("concat", {x, s}, {{"axis", axis.as_int()}});
}

ValueId tied_head_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  const std::string to = o.text("to");
  auto it = c.embeddings.find(to);
  if (it == c.embeddings.end()) {
    std::vector<std::string> names;
    for (const auto& [k, v] : c.embeddings) names.push_back(k);
    o.fail("to", cat("no embedding layer named '", to, "'", did_you_mean(to, names)));
  }
  need_float(c, x, "tied_head");
  const Shape table = c.b.shape(it->second);
  if (shape_of(c, x).back() != table[1])
    c.fail(cat("the input width ", shape_of(c, x).back(), " differs from the embedding width ", table[1]));
  std::vector<ValueId> in{x, it->second};
  // BERT's decoder: the tied weight plus a bias of vocabulary size of its own.
  if (o.flag("bias", false))
    in.push_back(c.param("b", {table[0]}, ParamInfo::of(ParamInfo::bias, table[1], table[0])));
  return c.b.op1("linear", in);
}

// x * saved, or with `layers` x * layers(saved): two branches of one input multiplied (a gated MLP written
// inline: save the input, build the gate, then `mul: {from: input, layers: [up projection]}`).
ValueId mul_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  ValueId s = saved(c, o);
  if (o.has("layers")) s = build_layers(c, o.layers("layers"), o.path("layers"), s, false);
  if (shape_of(c, s) != shape_of(c, x))
    o.fail("from", cat("the saved value is ", shape_str(shape_of(c, s)), " but the input is ",
                       shape_str(shape_of(c, x))));
  need_float(c, x, "mul");
  return c.b.mul(x, s);
}

// A list of integers option.
std::vector<int64_t> int_list(const Opts& o, const std::string& key) {
  const MValue v = o.value(key);
  std::vector<int64_t> out;
  if (v.is_list())
    for (const MValue& e : v.as_list()) {
      if (!e.is_int()) o.fail(key, cat("expected a list of integers, got ", v.repr()));
      out.push_back(e.as_int());
    }
  else
    o.fail(key, cat("expected a list of integers, got ", v.repr()));
  return out;
}

// An axis of the input written as in the full tensor (0 = batch, which these layers do not move; negative
// counts from the end): the normalised axis, at least 1.
int64_t sample_axis(const Opts& o, const std::string& key, int64_t axis, size_t rank) {
  const int64_t r = static_cast<int64_t>(rank);
  const int64_t a = axis < 0 ? axis + r : axis;
  if (a < 1 || a >= r)
    o.fail(key, cat("axis ", axis, " is not a per-sample axis of an input of rank ", r, " (1..", r - 1,
                    ", or -1..-", r - 1, "; axis 0 is the batch)"));
  return a;
}

ValueId reshape_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  const std::vector<int64_t> want = int_list(o, "shape");
  const Shape s = shape_of(c, x);
  const int64_t per = numel(s) / s[0];
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] == -1 && infer < 0) {
      infer = static_cast<int64_t>(i);
    } else if (want[i] < 1) {
      o.fail("shape",
             cat("dimensions are >= 1 with at most one -1 (the batch dim is kept, not written), got ",
                 shape_str(want)));
    } else {
      if (known > kMaxElements / want[i]) o.fail("shape", cat(shape_str(want), " is too large"));
      known *= want[i];
    }
  }
  Shape out{s[0]};
  for (int64_t d : want) out.push_back(d);
  if (infer >= 0) {
    if (per % known != 0)
      o.fail("shape",
             cat("cannot view the ", per, " elements per sample of ", shape_str(s), " as ", shape_str(want)));
    out[static_cast<size_t>(infer) + 1] = per / known;
  } else if (known != per) {
    o.fail("shape", cat("has ", known, " elements per sample but the input ", shape_str(s), " has ", per));
  }
  return c.b.reshape(x, out);
}

ValueId transpose_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  const std::vector<int64_t> dims = int_list(o, "dims");
  if (dims.size() != 2) o.fail("dims", cat("expected two axes [a, b], got ", dims.size()));
  const size_t r = shape_of(c, x).size();
  const int64_t a = sample_axis(o, "dims", dims[0], r), b = sample_axis(o, "dims", dims[1], r);
  return c.b.op1("transpose", {x}, {{"dim0", a}, {"dim1", b}});
}

// One position along a per-sample axis, the axis dropped: (B, T, D) -> (B, D) for axis 1 (ViT's class token).
ValueId select_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  const Shape s = shape_of(c, x);
  const MValue av = o.value("axis");
  if (!av.is_int()) o.fail("axis", cat("expected an integer, got ", av.repr()));
  const int64_t axis = sample_axis(o, "axis", av.as_int(), s.size());
  const MValue iv = o.has("index") ? o.value("index") : MValue(int64_t{0});
  if (!iv.is_int()) o.fail("index", cat("expected an integer, got ", iv.repr()));
  const int64_t n = s[static_cast<size_t>(axis)];
  const int64_t index = iv.as_int() < 0 ? iv.as_int() + n : iv.as_int();
  if (index < 0 || index >= n)
    o.fail("index", cat(iv.as_int(), " is out of range for axis ", axis, " of length ", n));
  const ValueId one = c.b.op1("slice", {x}, {{"axis", axis}, {"start", index}, {"end", index + 1}});
  Shape out = s;
  out.erase(out.begin() + axis);
  return c.b.reshape(one, out);
}

// Non-overlapping patches: conv2d with kernel = stride = patch (params w, b), then (B, dim, h, w) ->
// (B, h * w, dim), patches in row-major order.
ValueId patch_embed_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  need_rank(c, x, 4, "patch_embed", "(N, C, H, W) image");
  need_float(c, x, "patch_embed");
  const Shape s = shape_of(c, x);
  const std::vector<int64_t> p = o.pair("patch", std::nullopt, 1);
  const int64_t dim = o.integer("dim"), in = s[1];
  if (s[2] % p[0] != 0 || s[3] % p[1] != 0)
    o.fail("patch",
           cat("the image ", s[2], "x", s[3], " is not a whole number of ", p[0], "x", p[1], " patches"));
  const int64_t fan_in = in * p[0] * p[1], fan_out = dim * p[0] * p[1];
  const ValueId w = c.param("w", {dim, in, p[0], p[1]},
                            ParamInfo::of(ParamInfo::weight, fan_in, fan_out, true, false, o.init()));
  const ValueId b = c.param("b", {dim}, ParamInfo::of(ParamInfo::bias, fan_in, fan_out, true));
  const ValueId y = c.b.op1("conv2d", {x, w, b},
                            {{"stride", p}, {"padding", std::vector<int64_t>{0, 0}}, {"groups", int64_t{1}}});
  const int64_t n = (s[2] / p[0]) * (s[3] / p[1]);
  return transpose12(c, c.b.reshape(y, {s[0], dim, n}));
}

// A learnable (1, 1, dim) row `w` prepended along axis 1: (B, N, dim) -> (B, N + 1, dim).
ValueId class_token_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  need_rank(c, x, 3, "class_token", "(B, N, dim)");
  need_float(c, x, "class_token");
  const Shape s = shape_of(c, x);
  const int64_t dim = o.integer("dim");
  if (s[2] != dim) o.fail("dim", cat("is ", dim, " but the input has width ", s[2]));
  const ValueId w =
      c.param("w", {1, 1, dim}, ParamInfo::of(ParamInfo::position, dim, 1, false, false, o.init()));
  const ValueId rows = c.b.op1("broadcast_to", {w}, {{"shape", Shape{s[0], 1, dim}}});
  return c.b.op1("concat", {rows, x}, {{"axis", int64_t{1}}});
}

// BERT's token-type embedding for single-segment input (every token type 0): adds row 0 of the (types, dim)
// table `w`. The whole table is added to (B, T, 1, dim) and type 0 sliced out (row 1's gradient is zero,
// as with type ids all 0): the add reads the parameter itself, so under data parallelism its gradient goes
// through the bucketed all-reduce like any parameter's (slicing the parameter first would put a replicated
// op between it and the batch-split add).
ValueId token_type_embedding_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  need_rank(c, x, 3, "token_type_embedding", "(B, T, dim)");
  need_float(c, x, "token_type_embedding");
  const Shape s = shape_of(c, x);
  const int64_t types = o.integer("types", 2), dim = o.integer("dim");
  if (s[2] != dim) o.fail("dim", cat("is ", dim, " but the input has width ", s[2]));
  const ValueId w =
      c.param("w", {types, dim}, ParamInfo::of(ParamInfo::embedding, dim, types, false, false, o.init()));
  const ValueId all = c.b.add(c.b.reshape(x, {s[0], s[1], 1, dim}), w);
  const ValueId first =
      types == 1
          ? all
          : c.b.op1("slice", {all}, {{"axis", int64_t{2}}, {"start", int64_t{0}}, {"end", int64_t{1}}});
  return c.b.reshape(first, s);
}

// BERT's masked-language-model input: masks the token ids (op mlm_mask); its labels (the original id at the
// selected positions, -100 elsewhere) replace the data's targets in the loss. Eval programs mask with a
// draw that ignores the step (`fixed`), so every evaluation scores the same positions.
ValueId mlm_mask_layer(Ctx& c, const Opts& o, const std::string&, ValueId x) {
  if (c.b.dtype(x) != DType::i64 || shape_of(c, x).size() != 2)
    c.fail(cat("mlm_mask needs the (B, T) token ids of text data (put it first), got ",
               dtype_name(c.b.dtype(x)), " ", shape_str(shape_of(c, x))));
  if (c.targets != kNoValue) c.fail("the model has a second mlm_mask (one per model)");
  const int64_t vocab = o.integer("vocab"), mask_id = o.integer("mask_id", std::nullopt, 0);
  const double p = o.probability("p", 0.15);
  if (p == 0.0) o.fail("p", "must be > 0 (no position would be scored)");
  const std::vector<ValueId> out = c.b.op("mlm_mask", {x},
                                          {{"vocab", vocab},
                                           {"mask_id", mask_id},
                                           {"p", p},
                                           {"mask_p", 0.8},
                                           {"random_p", 0.1},
                                           {"fixed", !c.training}});
  c.targets = out[1];
  return out[0];
}

ValueId simple_activation(Ctx& c, const std::string& type, ValueId x) {
  return activation(c, x, type);
}

std::map<std::string, LayerDef> make_registry() {
  std::vector<LayerDef> defs = {
      {"linear", {"out", "bias", "init", "sbp"}, "y = x W^T + b over the last dim", true, linear_layer},
      {"conv2d",
       {"out", "kernel", "stride", "padding", "bias", "groups", "init"},
       "2-d convolution, NCHW",
       true,
       conv2d_layer},
      {"batchnorm", {"eps", "momentum"}, "batch normalisation over dim 1", true, batchnorm_layer},
      {"layernorm", {"eps"}, "layer normalisation over the last dim", true, layernorm_layer},
      {"rmsnorm", {"eps"}, "RMS normalisation over the last dim", true, rmsnorm_layer},
      {"maxpool", {"kernel", "stride", "padding"}, "2-d max pooling", true, maxpool_layer},
      {"avgpool", {"kernel", "stride", "padding"}, "2-d average pooling", true, avgpool_layer},
      {"global_avgpool", {}, "mean over H and W", true, global_avgpool_layer},
      {"flatten", {}, "(B, ...) -> (B, features)", true, flatten_layer},
      {"dropout", {"p"}, "inverted dropout (training only)", true, dropout_layer},
      {"gelu", {"approximate"}, "GELU activation", true, gelu_layer},
      {"activation", {"kind"}, "an activation chosen by a parameter", true, activation_layer},
      {"embedding", {"vocab", "dim", "init", "sbp"}, "token ids -> vectors", true, embedding_layer},
      {"pos_embedding",
       {"max_len", "dim", "init"},
       "learned positions added to (B, T, D)",
       true,
       pos_embedding_layer},
      {"attention",
       {"heads", "causal", "dropout", "bias", "kv_heads", "rope", "rope_theta", "qkv", "pad_id"},
       "multi-head self-attention",
       true,
       attention_layer},
      {"transformer_block",
       {"heads", "mlp_ratio", "dropout", "causal", "norm", "norm_eps", "mlp", "ffn", "bias", "kv_heads",
        "rope", "rope_theta", "qkv", "post_norm", "pad_id"},
       "transformer block (GPT-2 pre-LN by default)",
       true,
       transformer_block_layer},
      {"residual", {"layers", "shortcut", "activation"}, "layers(x) + shortcut(x)", true, residual_layer},
      {"repeat", {"times", "layers"}, "the layers `times` times", false, repeat_layer},
      {"for", {"each", "as", "layers"}, "the layers once per list item", false, for_layer},
      {"if", {"cond", "then", "else"}, "one branch of layers", false, if_layer},
      {"save", {}, "remembers the current value", false, save_layer},
      {"add", {"from"}, "adds a saved value", true, add_layer},
      {"concat", {"from", "axis"}, "concatenates a saved value", true, concat_layer},
      {"tied_head", {"to", "bias"}, "logits against an embedding table", true, tied_head_layer},
      {"mul", {"from", "layers"}, "multiplies by a saved value (or by layers of it)", true, mul_layer},
      {"reshape", {"shape"}, "new per-sample shape (batch kept)", true, reshape_layer},
      {"transpose", {"dims"}, "swaps two per-sample axes", true, transpose_layer},
      {"select", {"axis", "index"}, "one position of an axis, the axis dropped", true, select_layer},
      {"patch_embed", {"patch", "dim", "init"}, "image -> (B, patches, dim)", true, patch_embed_layer},
      {"class_token", {"dim", "init"}, "prepends a learnable row", true, class_token_layer},
      {"token_type_embedding",
       {"types", "dim", "init"},
       "adds token type 0's embedding",
       true,
       token_type_embedding_layer},
      {"mlm_mask",
       {"vocab", "mask_id", "p"},
       "BERT's input masking; its labels are the targets",
       true,
       mlm_mask_layer},
  };
  for (const std::string a : {"relu", "tanh", "sigmoid", "silu"})
    defs.push_back({a, {}, a, true, [a](Ctx& c, const Opts&, const std::string&, ValueId x) {
                      return simple_activation(c, a, x);
                    }});
  std::map<std::string, LayerDef> reg;
  for (auto& d : defs) reg.emplace(d.type, std::move(d));
  return reg;
}

struct Entry {
  std::string type;
  YAML::Node key, options;  // the type's node (for positions) and its options (null for a bare name)
};

Entry parse_entry(const Ctx& c, const YAML::Node& entry, const std::string& path) {
  if (entry.IsScalar()) return Entry{entry.Scalar(), entry, YAML::Node()};
  if (!entry.IsMap() || entry.size() != 1)
    fail(c.src, entry, path,
         "a layer is a map with one layer-type key (e.g. `- linear: {out: 10}`) or a bare name (`- relu`)");
  return Entry{entry.begin()->first.Scalar(), entry.begin()->first, entry.begin()->second};
}

std::string layer_name(Ctx& c, const Opts& o, const std::string& type, bool anonymous) {
  if (!o.has("name")) return anonymous ? "" : cat(type, c.counters.back()[type]++);
  const std::string n = o.text("name");
  if (n.empty() || n.find('/') != std::string::npos)
    o.fail("name", cat("'", abbreviate(n), "' is not a valid name (no '/')"));
  return n;
}

}  // namespace

const std::map<std::string, LayerDef>& layer_registry() {
  static const std::map<std::string, LayerDef> reg = make_registry();
  return reg;
}

ValueId build_layer(Ctx& c, const YAML::Node& entry, const std::string& path, ValueId x, bool anonymous,
                    std::string* name_out) {
  const Entry e = parse_entry(c, entry, path);
  const std::string& type = e.type;
  const auto& reg = layer_registry();
  auto it = reg.find(type);
  if (it == reg.end()) {
    std::vector<std::string> types;
    for (const auto& [k, v] : reg) types.push_back(k);
    fail(c.src, e.key, path, cat("unknown layer type '", abbreviate(type), "'", did_you_mean(type, types)));
  }
  const LayerDef& def = it->second;
  const std::string lpath = entry.IsScalar() ? path : cat(path, ".", type);
  const YAML::Node* outer_node = c.cur_node;
  const std::string outer_path = c.cur_path;
  c.cur_node = &entry;
  c.cur_path = lpath;
  if (++c.layers_built > kMaxLayers)
    c.fail(cat("the model unrolls to more than ", kMaxLayers,
               " layers (counting every repeat and for iteration)"));
  const Opts o(c, e.options, lpath, def);
  const std::string name = layer_name(c, o, type, anonymous);
  if (name_out) *name_out = name;
  // An activation-recompute segment (graph/recompute.cc): the layer's forward nodes run again in the
  // backward pass instead of keeping what they made. `recompute: true|false` on the layer decides, else
  // train.recompute: blocks takes the repeated units of the zoo's models, full every layer at the outermost
  // level (repeat, for and if have no scope of their own: their layers are outermost). Nested in a segment,
  // a layer is part of it.
  const bool by_mode = c.recompute == "full"
                           ? def.own_scope
                           : c.recompute == "blocks" && (type == "transformer_block" || type == "residual");
  const bool segment = o.flag("recompute", by_mode) && c.training && c.b.segment() < 0;
  if (segment) c.b.set_segment(c.segments++);
  ValueId y;
  try {
    Scope s(c, def.own_scope ? name : "");
    y = def.build(c, o, name, x);
  } catch (const LocatedError&) {
    throw;
  } catch (const Error& err) {
    if (err.code() != ExitCode::bad_input) throw;
    fail(c.src, entry, lpath, err.what());  // a graph op rejected the wiring (shapes, dtypes)
  }
  if (segment) c.b.set_segment(-1);
  c.check_size("the output", c.b.shape(y));
  c.cur_node = outer_node;
  c.cur_path = outer_path;
  return y;
}

ValueId build_layers(Ctx& c, const YAML::Node& list, const std::string& path, ValueId x,
                     bool anonymous_single) {
  if (!list.IsSequence()) fail(c.src, list, path, "expected a list of layers");
  const bool single = anonymous_single && list.size() == 1;
  for (size_t i = 0; i < list.size(); ++i) x = build_layer(c, list[i], cat(path, "[", i, "]"), x, single);
  return x;
}

}  // namespace flowrun::nn
