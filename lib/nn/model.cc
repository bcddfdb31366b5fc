// build_model: finds the model (zoo file or inline layers), binds its parameters (defaults, config
// overrides, `let`, `checks`), builds the layers into the graph, and adds the cross-entropy loss.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "nn/loader.h"

namespace flowrun {

using namespace nn;

namespace {

const std::vector<std::string> kTopKeys = {"doc", "init", "params", "let", "checks", "layers"};
const std::vector<std::string> kSchemes = {"pytorch", "gpt2", "kaiming"};

struct ModelFile {
  Source src;
  std::string name;  // zoo name, or "inline"
  bool zoo = false;
  YAML::Node params, let, checks, layers, init;
};

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += cat(out.empty() ? "" : ", ", s);
  return out;
}

std::vector<std::string> zoo_names(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".yaml") names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Parses a model file; positions in parse errors are those of the file as written.
YAML::Node parse_model_file(const std::string& path, Source* src) {
  const std::string text = read_yaml_file(path, "model");
  src->file = path;
  try {
    return load_yaml(quote_expressions(text, &src->inserted));
  } catch (const YAML::Exception& e) {
    throw input_error(cat(src->at(e.mark), ": ", e.msg));
  }
}

ModelFile load_zoo(const ModelConfig& cfg) {
  const std::string dir = zoo_directory(cfg);
  const std::string path = cat(dir, "/", cfg.zoo, ".yaml");
  if (!std::filesystem::exists(path)) {
    const std::vector<std::string> names = zoo_names(dir);
    throw input_error(cat("model.zoo: unknown zoo model '", abbreviate(cfg.zoo), "'",
                          did_you_mean(cfg.zoo, names), " in ", dir,
                          "; available: ", names.empty() ? "none" : join(names)));
  }
  Source src;
  const YAML::Node root = parse_model_file(path, &src);
  if (!root.IsMap()) fail(src, root, "model", "a model file is a map with doc, init, params and layers");
  for (const auto& kv : root) {
    const std::string key = kv.first.Scalar();
    if (std::find(kTopKeys.begin(), kTopKeys.end(), key) == kTopKeys.end())
      fail(src, kv.first, key,
           cat("unknown key", did_you_mean(key, kTopKeys), "; model files have ", join(kTopKeys)));
  }
  if (!root["layers"]) fail(src, root, "layers", "missing: a model file needs a layer list");
  // Nodes are copy-constructed: assigning to a yaml-cpp Node that refers to a node rewrites that node.
  return ModelFile{src,         cfg.zoo,        true,           root["params"],
                   root["let"], root["checks"], root["layers"], root["init"]};
}

// Where a key of the config's model section came from ("cfg.yaml:4:3" or "--set model.x=1"), if known.
Source config_source(const ModelConfig& cfg, const std::string& key) {
  Source s;
  for (const std::string& k : {key, cat("params.", key)}) {
    auto it = cfg.origins.find(k);
    if (it != cfg.origins.end()) {
      s.fixed = it->second.str();
      break;
    }
  }
  s.path_prefix = "model.";
  return s;
}

ModelFile inline_model(const ModelConfig& cfg) {
  Source src;
  auto it = cfg.origins.find("layers");
  src.file = it != cfg.origins.end() ? it->second.file : "config";
  src.path_prefix = "model.";
  if (!cfg.layers.IsSequence()) throw input_error("model: give either `zoo: NAME` or a `layers:` list");
  return ModelFile{src, "inline", false, cfg.params, YAML::Node(), YAML::Node(), cfg.layers, YAML::Node()};
}

void set_builtins(Env& env, const ModelInputs& in) {
  env.set("num_classes", MValue(in.num_classes));
  env.set("in_channels", MValue(in.x_shape.size() > 1 ? in.x_shape[1] : int64_t{1}));
  env.set("in_features", MValue(numel(in.x_shape) / in.x_shape[0]));
  if (!in.text && in.x_shape.size() == 4) {  // images: patch grids (ViT) need the sides
    env.set("in_height", MValue(in.x_shape[2]));
    env.set("in_width", MValue(in.x_shape[3]));
  }
  if (in.text) {
    env.set("vocab", MValue(in.num_classes));
    env.set("seq_len", MValue(in.x_shape[1]));
  }
}

// The declared parameters with their defaults or the config's overrides; `where` gets each one's
// "position: key path" for messages about it.
void bind_params(const ModelFile& m, const ModelConfig& cfg, Env& env,
                 std::map<std::string, std::string>* where) {
  if (m.params.IsDefined() && !m.params.IsNull() && !m.params.IsMap())
    fail(m.src, m.params, "params", "expected a map of parameter names to default values");
  std::vector<std::string> declared;
  for (const auto& kv : m.params) declared.push_back(kv.first.Scalar());
  if (m.zoo && cfg.params.IsMap())
    for (const auto& kv : cfg.params) {
      const std::string key = kv.first.Scalar();
      if (std::find(declared.begin(), declared.end(), key) == declared.end())
        fail(config_source(cfg, key), kv.second, abbreviate(key),
             cat("unknown parameter of zoo model '", m.name, "'", did_you_mean(key, declared),
                 "; its parameters: ", declared.empty() ? "none" : join(declared)));
    }
  const std::vector<std::string> builtins = env.names();
  for (const auto& kv : m.params) {
    const std::string name = kv.first.Scalar(), path = cat("params.", name);
    if (std::find(builtins.begin(), builtins.end(), name) != builtins.end())
      fail(m.src, kv.first, path,
           "is a built-in name (num_classes, vocab, seq_len, in_channels, in_features, in_height, in_width)");
    MValue v = to_value(kv.second, env, m.src, path);
    (*where)[name] = cat(m.src.at(kv.second.Mark()), ": ", m.src.path_prefix, path);
    if (m.zoo && cfg.params.IsMap() && cfg.params[name]) {
      const Source cs = config_source(cfg, name);
      const MValue o = to_value(cfg.params[name], env, cs, name);
      if (o.v.index() != v.v.index() && !(v.is_float() && o.is_int()))
        fail(cs, cfg.params[name], name,
             cat("expected ", v.is_int() ? "an " : "a ", v.type_name(), " like the default ", v.repr(),
                 ", got ", o.repr(), " (", o.type_name(), ")"));
      v = v.is_float() ? MValue(o.as_float()) : o;
      (*where)[name] = cat(cs.fixed.empty() ? "" : cat(cs.fixed, ": "), "model.", name);
    }
    env.set(name, v);
  }
}

// `let:` derived values, in order.
void bind_let(const ModelFile& m, Env& env) {
  if (!m.let.IsDefined() || m.let.IsNull()) return;
  if (!m.let.IsMap()) fail(m.src, m.let, "let", "expected a map of names to expressions");
  for (const auto& kv : m.let) {
    const std::string name = kv.first.Scalar();
    if (env.find(name)) fail(m.src, kv.first, cat("let.", name), "is already a parameter or built-in name");
    env.set(name, to_value(kv.second, env, m.src, cat("let.", name)));
  }
}

// `checks:` [{that: ${cond}, param: name, message: "..."}]: a false condition is an error at the named
// parameter (its config override, or its default in the file).
void run_checks(const ModelFile& m, const Env& env, const std::map<std::string, std::string>& where) {
  if (!m.checks.IsDefined() || m.checks.IsNull()) return;
  if (!m.checks.IsSequence()) fail(m.src, m.checks, "checks", "expected a list of {that, param, message}");
  for (size_t i = 0; i < m.checks.size(); ++i) {
    const YAML::Node c = m.checks[i];
    const std::string path = cat("checks[", i, "]");
    if (!c.IsMap() || !c["that"] || !c["message"])
      fail(m.src, c, path, "expected {that: ${condition}, param: name, message: text}");
    const MValue ok = to_value(c["that"], env, m.src, path + ".that");
    if (!ok.is_bool()) fail(m.src, c["that"], path + ".that", cat("expected a condition, got ", ok.repr()));
    if (ok.as_bool()) continue;
    const std::string msg = to_value(c["message"], env, m.src, path + ".message").text();
    const std::string param = c["param"] ? c["param"].Scalar() : "";
    auto it = where.find(param);
    if (it == where.end()) fail(m.src, c, path, msg);
    throw LocatedError(cat(it->second, ": ", msg));
  }
}

std::string init_scheme(const ModelFile& m, const ModelConfig& cfg) {
  if (!cfg.init.empty()) {
    if (std::find(kSchemes.begin(), kSchemes.end(), cfg.init) == kSchemes.end())
      fail(config_source(cfg, "init"), YAML::Node(), "init",
           cat("expected one of ", join(kSchemes), ", got '", cfg.init, "'",
               did_you_mean(cfg.init, kSchemes)));
    return cfg.init;
  }
  if (!m.init.IsDefined() || m.init.IsNull()) return "pytorch";
  const std::string s = m.init.Scalar();
  if (std::find(kSchemes.begin(), kSchemes.end(), s) == kSchemes.end())
    fail(m.src, m.init, "init",
         cat("expected one of ", join(kSchemes), ", got '", s, "'", did_you_mean(s, kSchemes)));
  return s;
}

std::string summary_row(const std::string& name, const std::string& shape, const std::string& params) {
  std::ostringstream os;
  os << name << std::string(name.size() < 24 ? 24 - name.size() : 1, ' ') << shape
     << std::string(shape.size() < 22 ? 22 - shape.size() : 1, ' ') << params << "\n";
  return os.str();
}

// The mean cross-entropy over every position; cross_entropy reduces over all leading dims, so (B, T, V)
// logits with (B, T) targets need no flattening (and integer labels no reshape kernel).
// `denominator` (kNoValue: none): cross_entropy's, in place of the count of valid targets.
ValueId add_loss(GraphBuilder& b, const ModelFile& m, const ModelInputs& in, ValueId logits, ValueId y,
                 ValueId denominator) {
  const Shape s = b.shape(logits);
  Shape want =
      in.text ? Shape{in.x_shape[0], in.x_shape[1], in.num_classes} : Shape{in.x_shape[0], in.num_classes};
  // A language model may predict over more tokens than the data uses (GPT-2's 50257 on bytes, a vocabulary
  // padded to a multiple of 64): every target is still a valid class.
  if (in.text && s.size() == 3 && s[2] >= in.num_classes) want[2] = s[2];
  if (s != want)
    throw input_error(cat(m.src.file, ": layers: the model's output is ", shape_str(s),
                          " but the loss needs ",
                          in.text ? "(B, T, vocab) = " : "(B, num_classes) = ", shape_str(want),
                          in.text ? "" : " (end the layers with flatten and linear: {out: ${num_classes}})"));
  std::vector<ValueId> ins = {logits, y};
  if (denominator != kNoValue) ins.push_back(denominator);
  return b.op("cross_entropy", ins, {{"ignore_index", int64_t{-100}}}, "loss")[0];
}

}  // namespace

std::string with_commas(int64_t n) {
  const std::string digits = std::to_string(n);
  std::ostringstream os;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) os << ',';
    os << digits[i];
  }
  return os.str();
}

YAML::Node zoo_params(const ModelConfig& cfg) {
  if (cfg.zoo.empty()) throw input_error("model: an inline model has no zoo defaults");
  return load_zoo(cfg).params;
}

std::string zoo_directory(const ModelConfig& cfg) {
  if (!cfg.zoo_dir.empty()) return cfg.zoo_dir;
  if (const char* env = std::getenv("FLOWRUN_MODELS"); env != nullptr && *env != '\0') return env;
  return FLOWRUN_MODELS_DIR;
}

BuiltModel build_model(Graph& g, const ModelConfig& cfg, const ModelInputs& in, bool training,
                       const std::string& recompute) {
  FR_CHECK(in.x_shape.size() >= 2 && in.num_classes > 0, "model inputs need (B, ...) and classes");
  const ModelFile m = cfg.zoo.empty() ? inline_model(cfg) : load_zoo(cfg);
  Ctx c(g, m.src, training);
  c.recompute = recompute;
  set_builtins(c.env, in);
  if (in.cache_len > 0) {
    FR_CHECK(in.text, "decoding needs text inputs");
    c.env.set("seq_len", MValue(in.cache_len));  // the context the model was trained for, not x's length
    c.cache_len = in.cache_len;
  }
  std::map<std::string, std::string> where;
  c.env.push();
  bind_params(m, cfg, c.env, &where);
  bind_let(m, c.env);
  run_checks(m, c.env, where);
  const std::string scheme = init_scheme(m, cfg);

  BuiltModel out;
  out.x = c.b.input("x", in.x_shape, in.text ? DType::i64 : DType::f32);
  if (in.cache_len > 0)
    c.position = c.b.input("position", {1}, DType::i64);
  else
    out.y = c.b.input("y", in.text ? in.x_shape : Shape{in.x_shape[0]}, DType::i64);
  if (!m.layers.IsSequence()) fail(m.src, m.layers, "layers", "expected a list of layers");
  std::string summary = summary_row("layer", "output", "params");
  ValueId h = out.x;
  if (in.text) c.ids = out.x;
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const int64_t before = c.num_params;
    std::string name;
    h = build_layer(c, m.layers[i], cat("layers[", i, "]"), h, false, &name);
    out.layers[name] = h;
    summary += summary_row(name, shape_str(c.b.shape(h)), with_commas(c.num_params - before));
  }
  out.summary = summary + summary_row("total", "", with_commas(c.num_params));
  out.logits = h;
  g.mark_output("logits", out.logits);
  out.init = resolve_init(c, scheme);
  out.num_params = c.num_params;
  out.env = c.env;
  if (in.cache_len > 0) {
    if (c.targets != kNoValue)
      fail(m.src, m.layers, "layers", "an mlm_mask model (an encoder) does not generate");
    return out;
  }
  // An mlm_mask layer's labels are the targets (the data's next tokens are not what BERT predicts). They
  // are drawn again next to the loss by a second mlm_mask node of the same name and attributes on the same
  // ids (a node's Philox stream is keyed by its name, so the draw is the same), so that a pipeline cut
  // between blocks has only the hidden state to hand on, not labels made at the model's input.
  // The loss divides by the masking's count, the masked positions of the step's whole batch over the
  // pieces it is cut into (ranks, micro-batches): each piece's mean is over the whole step's count, so the
  // mean of the pieces' losses, which data parallelism and accumulation take, is the whole step's mean.
  ValueId targets = out.y, denominator = kNoValue;
  if (c.targets != kNoValue) {
    const Node& first = g.node(g.value(c.targets).producer);
    const std::string name = first.name;
    const Attrs attrs = first.attrs;
    const ValueId ids = first.inputs.at(0);
    const std::vector<ValueId> twin = g.add_node("mlm_mask", {ids}, attrs, name);
    targets = twin.at(1);
    denominator = twin.at(2);
  }
  out.loss = add_loss(c.b, m, in, h, targets, denominator);
  // Eval programs also hand out the labels the loss scored (-100 where not masked), for an accuracy over
  // the masked positions rather than against the data's next tokens.
  if (c.targets != kNoValue && !training) g.mark_output("targets", targets);
  g.mark_output("loss", out.loss);
  return out;
}

std::vector<std::pair<std::string, std::string>> list_zoo(const std::string& zoo_dir) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& name : zoo_names(zoo_dir)) {
    Source src;
    const YAML::Node root = parse_model_file(cat(zoo_dir, "/", name, ".yaml"), &src);
    out.emplace_back(name, root.IsMap() && root["doc"] ? root["doc"].Scalar() : "");
  }
  return out;
}

}  // namespace flowrun
