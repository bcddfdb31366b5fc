// Export to and import from safetensors files, with the zoo's Hugging Face name maps (models/hf/*.yaml).
#include "ckpt/weights.h"

#include <spdlog/spdlog.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "ckpt/checkpoint.h"
#include "data/dataset.h"
#include "io/safetensors.h"
#include "nn/model.h"
#include "train/run_dir.h"

namespace flowrun {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kNamesKey[] = "flowrun_names";  // metadata: "flowrun" or "hf"

// A name pattern with `{i}` (a block index) as a regex capturing the index.
std::regex pattern_regex(const std::string& pattern) {
  std::string re;
  for (size_t k = 0; k < pattern.size(); ++k) {
    if (pattern.compare(k, 3, "{i}") == 0) {
      re += "(\\d+)";
      k += 2;
    } else if (std::strchr(".[]()*+?^$|\\{}", pattern[k])) {
      re += '\\';
      re += pattern[k];
    } else {
      re += pattern[k];
    }
  }
  return std::regex(re);
}

// `pattern` with its `{i}` replaced by `index`.
std::string substitute(const std::string& pattern, const std::string& index) {
  std::string out = pattern;
  for (size_t at = out.find("{i}"); at != std::string::npos; at = out.find("{i}", at + index.size()))
    out.replace(at, 3, index);
  return out;
}

// The name `pattern_from` gives `name`, mapped through `pattern_to`; nullopt when it does not match.
std::optional<std::string> map_name(const std::string& name, const std::string& pattern_from,
                                    const std::string& pattern_to) {
  std::smatch m;
  if (!std::regex_match(name, m, pattern_regex(pattern_from))) return std::nullopt;
  return substitute(pattern_to, m.size() > 1 ? m[1].str() : std::string());
}

bool matches_any(const std::string& name, const std::vector<std::string>& patterns) {
  for (const auto& p : patterns)
    if (std::regex_match(name, pattern_regex(p))) return true;
  return false;
}

json to_json(const nn::MValue& v) {
  if (v.is_int()) return v.as_int();
  if (v.is_float()) return v.as_float();
  if (v.is_bool()) return v.as_bool();
  if (v.is_string()) return v.as_string();
  json a = json::array();
  for (const auto& x : v.as_list()) a.push_back(to_json(x));
  return a;
}

// A YAML value as JSON: `${...}` evaluated over `env` (when given: a resolved config's strings stay as they
// are), plain scalars typed (null, booleans, integers, numbers, else strings), quoted scalars strings.
json yaml_to_json(const YAML::Node& n, const nn::Env* env, const std::string& where) {
  if (n.IsMap()) {
    json o = json::object();
    for (const auto& kv : n)
      o[kv.first.Scalar()] = yaml_to_json(kv.second, env, cat(where, ".", kv.first.Scalar()));
    return o;
  }
  if (n.IsSequence()) {
    json a = json::array();
    for (size_t i = 0; i < n.size(); ++i) a.push_back(yaml_to_json(n[i], env, cat(where, "[", i, "]")));
    return a;
  }
  if (n.IsNull()) return nullptr;
  const std::string s = n.Scalar();
  if (env && s.size() > 3 && s.rfind("${", 0) == 0 && s.back() == '}') {
    try {
      return to_json(nn::eval_expr(s.substr(2, s.size() - 3), *env));
    } catch (const nn::ExprError& e) {
      throw input_error(cat(where, ": ", s, ": ", e.what()));
    }
  }
  if (n.Tag() == "!") return s;  // quoted
  if (s == "null" || s == "~") return nullptr;
  if (s == "true" || s == "false") return s == "true";
  int64_t i = 0;
  if (auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), i);
      ec == std::errc() && p == s.data() + s.size())
    return i;
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (!s.empty() && end == s.c_str() + s.size()) return d;
  return s;
}

std::vector<std::string> string_list(const YAML::Node& n, const std::string& where) {
  std::vector<std::string> out;
  if (!n) return out;
  if (!n.IsSequence()) throw input_error(cat(where, ": expected a list of names"));
  for (const auto& x : n) out.push_back(x.Scalar());
  return out;
}

// A 2-d tensor with its axes swapped (any dtype).
Tensor transposed(const Tensor& t) {
  FR_CHECK(t.shape().size() == 2, "only 2-d tensors are transposed, got ", shape_str(t.shape()));
  const int64_t r = t.shape()[0], c = t.shape()[1];
  Tensor out = Tensor::empty({c, r}, t.dtype());
  const size_t es = dtype_size(t.dtype());
  const auto* in = static_cast<const char*>(t.raw());
  auto* o = static_cast<char*>(out.raw());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) std::memcpy(o + (j * r + i) * es, in + (i * c + j) * es, es);
  return out;
}

Shape transposed_shape(const Shape& s) {
  return s.size() == 2 ? Shape{s[1], s[0]} : s;
}

// The first `most` names, and how many more there are.
std::string list_names(const std::vector<std::string>& names, size_t most = 8) {
  if (names.size() <= most) return join(names);
  return cat(join({names.begin(), names.begin() + static_cast<std::ptrdiff_t>(most)}), " and ",
             names.size() - most, " more");
}

}  // namespace

std::optional<HfMap> load_hf_map(const ModelConfig& cfg, const nn::Env& env) {
  if (cfg.zoo.empty()) return std::nullopt;
  const std::string path = cat(zoo_directory(cfg), "/hf/", cfg.zoo, ".yaml");
  if (!fs::exists(path)) return std::nullopt;
  YAML::Node root;
  try {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) throw input_error(cat(path, ": cannot read: ", std::strerror(errno)));
    root = YAML::Load(quote_expressions(text.str()));
  } catch (const YAML::Exception& e) {
    throw input_error(cat(path, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.msg));
  }
  HfMap m;
  m.file = path;
  static const std::set<std::string> keys = {"architecture", "base_prefix", "config", "tensors",
                                             "tied",         "optional",    "ignore"};
  if (!root.IsMap()) throw input_error(cat(path, ": expected a map (architecture, config, tensors, ...)"));
  for (const auto& kv : root)
    if (!keys.count(kv.first.Scalar()))
      throw input_error(
          cat(path, ":", kv.first.Mark().line + 1, ": unknown key '", kv.first.Scalar(),
              "' (a map has architecture, base_prefix, config, tensors, tied, optional, ignore)"));
  if (!root["architecture"] || !root["tensors"] || !root["tensors"].IsMap() || !root["config"] ||
      !root["config"].IsMap())
    throw input_error(cat(path, ": a map needs architecture, config (a map) and tensors (a map)"));
  m.architecture = root["architecture"].Scalar();
  if (root["base_prefix"]) m.base_prefix = root["base_prefix"].Scalar();
  m.config_json = yaml_to_json(root["config"], &env, cat(path, ": config")).dump(2) + "\n";
  for (const auto& kv : root["tensors"]) {
    HfMap::Rule r;
    r.flowrun = kv.first.Scalar();
    if (kv.second.IsMap()) {
      if (!kv.second["name"])
        throw input_error(cat(path, ":", kv.second.Mark().line + 1, ": tensors.", r.flowrun, ": no name"));
      r.hf = kv.second["name"].Scalar();
      r.transpose = kv.second["transpose"] && kv.second["transpose"].as<bool>();
    } else {
      r.hf = kv.second.Scalar();
    }
    m.tensors.push_back(r);
  }
  if (root["tied"])
    for (const auto& kv : root["tied"]) m.tied[kv.first.Scalar()] = kv.second.Scalar();
  m.optional = string_list(root["optional"], cat(path, ": optional"));
  m.ignore = string_list(root["ignore"], cat(path, ": ignore"));
  return m;
}

std::map<std::string, Tensor> import_safetensors(const std::string& path,
                                                 const std::map<std::string, WantedTensor>& want,
                                                 const std::optional<HfMap>& map) {
  std::map<std::string, std::string> meta;
  std::map<std::string, Tensor> file = safetensors::read(path, &meta);
  const std::string where = cat("safetensors file ", path);
  // Which names: what export wrote, else flowrun's when any tensor is named as one of the model's.
  std::string names;
  if (auto it = meta.find(kNamesKey); it != meta.end()) names = it->second;
  if (names.empty()) {
    names = "hf";
    for (const auto& [n, t] : file)
      if (want.count(n)) names = "flowrun";
  }
  if (names != "flowrun" && names != "hf")
    throw input_error(
        cat(where, ": metadata ", kNamesKey, " is '", names, "' (export writes flowrun or hf)"));
  if (names == "hf" && !map) {
    std::vector<std::string> some;
    for (const auto& [n, t] : file) some.push_back(n);
    throw input_error(cat(where, ": its tensors (", list_names(some, 4),
                          ") are not the model's parameter names, and the model has no Hugging Face name map "
                          "(models/hf/<zoo model>.yaml)"));
  }
  // A base model's file (GPT2Model, BertModel) names its tensors without the head model's prefix.
  bool add_prefix = false;
  if (names == "hf" && !map->base_prefix.empty()) {
    add_prefix = true;
    for (const auto& [n, t] : file)
      if (n.rfind(map->base_prefix, 0) == 0) add_prefix = false;
  }
  struct Source {
    std::string file_name;
    bool transpose = false;
  };
  std::map<std::string, Source> source;  // flowrun name -> the file's tensor
  std::vector<std::string> unused, problems;
  std::vector<std::pair<std::string, std::string>> tied;  // file name -> the flowrun tensor it is tied to
  for (const auto& [n, t] : file) {
    const std::string hf = add_prefix ? map->base_prefix + n : n;
    std::optional<Source> src;
    std::string target;
    if (names == "flowrun") {
      if (want.count(n)) src = Source{n, false}, target = n;
    } else {
      for (const auto& r : map->tensors)
        if (auto f = map_name(hf, r.hf, r.flowrun); f && want.count(*f)) {
          src = Source{n, r.transpose};
          target = *f;
          break;
        }
    }
    if (src) {
      if (auto [it, fresh] = source.emplace(target, *src); !fresh)
        problems.push_back(cat("'", n, "' and '", it->second.file_name, "' both map to '", target, "'"));
      continue;
    }
    if (names == "hf") {
      bool is_tied = false;
      for (const auto& [pattern, to] : map->tied)
        if (auto f = map_name(hf, pattern, to); f && want.count(*f)) {
          tied.emplace_back(n, *f);
          is_tied = true;
          break;
        }
      if (is_tied || matches_any(hf, map->ignore)) continue;
    }
    unused.push_back(n);
  }
  std::map<std::string, Tensor> out;
  std::vector<std::string> kept;
  for (const auto& [name, w] : want) {
    auto it = source.find(name);
    if (it == source.end()) {
      if (w.optional || (map && names == "hf" && matches_any(name, map->optional)))
        kept.push_back(name);
      else
        problems.push_back(cat("'", name, "' ", shape_str(w.shape), " of the model is missing",
                               names == "hf" ? cat(
                                                   " (its Hugging Face name: ",
                                                   [&] {
                                                     for (const auto& r : map->tensors)
                                                       if (auto h = map_name(name, r.flowrun, r.hf))
                                                         return *h;
                                                     return std::string("none in the map");
                                                   }(),
                                                   ")")
                                             : std::string()));
      continue;
    }
    const Tensor& t = file.at(it->second.file_name);
    const std::string label = it->second.file_name == name
                                  ? cat("'", name, "'")
                                  : cat("'", it->second.file_name, "' (-> '", name, "'",
                                        it->second.transpose ? ", transposed" : "", ")");
    const Shape shape = it->second.transpose ? transposed_shape(t.shape()) : t.shape();
    if (it->second.transpose && t.shape().size() != 2) {
      problems.push_back(cat(label, " is ", shape_str(t.shape()), ": a 2-d weight was expected"));
      continue;
    }
    if (shape != w.shape) {
      problems.push_back(
          cat(label, " is ", safetensors::format_dtype(t.dtype()), " ", shape_str(t.shape()),
              it->second.transpose ? cat(" (", shape_str(shape), " transposed)") : std::string(),
              " but the model's is ", shape_str(w.shape)));
      continue;
    }
    if (is_floating(w.dtype) != is_floating(t.dtype())) {
      problems.push_back(cat(label, " is ", safetensors::format_dtype(t.dtype()), " but the model's is ",
                             dtype_name(w.dtype)));
      continue;
    }
    const Tensor laid = it->second.transpose ? transposed(t) : t;
    out.emplace(name, laid.dtype() == w.dtype ? laid : laid.to(w.dtype));
  }
  if (!problems.empty()) {
    std::string msg = cat(where, ": ", problems.size(), " tensor", problems.size() > 1 ? "s do" : " does",
                          " not fit the model (",
                          names == "hf" ? cat("Hugging Face names, ", map->file) : "flowrun names", "):");
    for (const auto& p : problems) msg += cat("\n  ", p);
    throw input_error(msg);
  }
  for (const auto& [n, to] : tied) {
    const Tensor& a = file.at(n);
    const Tensor& b = out.count(to) ? out.at(to) : Tensor();
    if (b.defined() && (a.shape() != b.shape() || a.to_f64() != b.to_f64()))
      spdlog::warn(
          "{}: '{}' is tied to '{}' in this model, but the file's values differ; the model uses '{}'", where,
          n, to, to);
  }
  if (!kept.empty())
    spdlog::warn("{}: the file lacks {} of the model's tensors, which keep their initial values: {}", where,
                 kept.size(), list_names(kept, 100));
  if (!unused.empty())
    spdlog::warn("{}: {} tensor{} of the file the model does not use: {}", where, unused.size(),
                 unused.size() > 1 ? "s" : "", list_names(unused, 100));
  spdlog::info("{}: {} tensors imported ({} names)", where, out.size(), names);
  return out;
}

std::string export_checkpoint(const std::string& checkpoint, const std::string& out_dir,
                              const std::string& format, const std::string& names) {
  if (format != "safetensors")
    throw input_error(cat("--format: only safetensors is written, not '", format, "'"));
  if (names != "flowrun" && names != "hf")
    throw input_error(cat("--names: flowrun or hf, not '", names, "'"));
  if (!fs::exists(checkpoint)) throw input_error(cat("export: checkpoint ", checkpoint, " does not exist"));
  const CheckpointData ck = load_checkpoint(checkpoint);
  const RunConfig cfg = config_from_resolved(ck.config_yaml, checkpoint);
  // The model's weights: parameters and running statistics (BatchNorm), not the optimizer's or the loss
  // scaler's state.
  std::map<std::string, Tensor> weights = ck.params;
  for (const auto& [n, t] : ck.state)
    if (is_model_state(n)) weights.emplace(n, t);
  // No step or date: the same weights give the same file (export -> --init-from -> export is bit-identical).
  std::map<std::string, std::string> meta = {
      {"format", "pt"},  // Transformers refuses other formats
      {kNamesKey, names},
      {"flowrun_model", cfg.model.zoo.empty() ? "inline" : cfg.model.zoo},
      {"flowrun_version", FLOWRUN_VERSION}};
  std::map<std::string, Tensor> out;
  std::string config;
  if (names == "flowrun") {
    out = weights;
    json c = {
        {"flowrun_version", FLOWRUN_VERSION}, {"flowrun_model", meta["flowrun_model"]}, {"step", ck.step}};
    c["config"] = yaml_to_json(YAML::Load(ck.config_yaml), nullptr, checkpoint);
    config = c.dump(2) + "\n";
  } else {
    // The map's config values are the model's parameters: build it as training did (its data's shapes).
    const auto data = open_dataset(cfg.data);
    ModelInputs in;
    in.text = data->spec().text;
    in.x_shape = {1};
    in.x_shape.insert(in.x_shape.end(), data->spec().sample_shape.begin(), data->spec().sample_shape.end());
    in.num_classes = data->spec().num_classes;
    Graph g;
    const BuiltModel m = build_model(g, cfg.model, in, false);
    const std::optional<HfMap> map = load_hf_map(cfg.model, m.env);
    if (!map)
      throw input_error(cat("--names hf: the checkpoint's model (",
                            cfg.model.zoo.empty() ? std::string("inline") : cfg.model.zoo,
                            ") has no Hugging Face name map (", zoo_directory(cfg.model),
                            "/hf/<zoo model>.yaml)"));
    std::vector<std::string> unmapped;
    for (const auto& [n, t] : weights) {
      bool done = false;
      for (const auto& r : map->tensors)
        if (auto h = map_name(n, r.flowrun, r.hf)) {
          out.emplace(*h, r.transpose ? transposed(t) : t);
          done = true;
          break;
        }
      if (!done) unmapped.push_back(n);
    }
    if (!unmapped.empty())
      throw input_error(cat("--names hf: ", map->file, " has no Hugging Face name for ", unmapped.size(),
                            " tensor(s) of ", checkpoint, ": ", list_names(unmapped, 100)));
    config = map->config_json;
    meta["flowrun_architecture"] = map->architecture;
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw runtime_error(cat("cannot create ", out_dir, ": ", ec.message()));
  const std::string st = (fs::path(out_dir) / "model.safetensors").string();
  replace_file_atomically(st, [&](const std::string& tmp) { safetensors::write(tmp, out, meta); });
  write_file_atomically((fs::path(out_dir) / "config.json").string(), config);
  return cat("wrote ", st, " (", out.size(), " tensors, ", names, " names) and ",
             (fs::path(out_dir) / "config.json").string());
}

}  // namespace flowrun
