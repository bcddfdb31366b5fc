// Loading a run config: the YAML file and `--set` overrides are read into one map of given values (checking
// structure: sections, known keys, duplicates), then every schema key is validated and stored, derived
// defaults filled, cross-field rules checked, and the resolved config built.
#include "config/config.h"

#include <set>
#include <sstream>

#include "config/checks.h"
#include "config/schema.h"
#include "core/error.h"

namespace flowrun {
namespace {

using config::Key;
using config::origin_at;
using config::Section;

// A value as the user wrote it, with where it was written.
struct Given {
  YAML::Node node;
  Origin origin;
};

// Everything the file and the overrides say, merged (a later override replaces an earlier value).
struct Input {
  std::string file;
  std::map<std::string, Given> values;        // schema key path ("optimizer.lr") -> value
  std::map<std::string, Origin> sections;     // section name -> where its map is
  std::map<std::string, Given> model_params;  // model parameter name -> value (model.params and zoo keys)
  std::map<std::string, Origin> bare_keys;  // where parameters were written directly under `model` (zoo only)
  std::map<std::string, Origin> model_origins;  // key path inside `model` -> origin (ModelConfig.origins)
};

std::vector<std::string> section_names() {
  std::vector<std::string> names;
  for (const auto& s : config::schema()) names.push_back(s.name);
  return names;
}

std::vector<std::string> key_names(const Section& section) {
  std::vector<std::string> names;
  for (const auto& k : section.keys) names.push_back(k.name);
  return names;
}

// Reads YAML maps into an Input, rejecting unknown sections and keys and duplicate keys (which yaml-cpp
// accepts silently, keeping both pairs).
class Reader {
 public:
  explicit Reader(Input& in) : in_(in) {}

  void file(const YAML::Node& root) {
    Origin base;
    base.file = in_.file;
    if (!root.IsDefined() || root.IsNull())
      throw input_error(cat(in_.file, ": the config is empty (expected a map with the sections ",
                            join(section_names()), ")"));
    if (!root.IsMap())
      throw input_error(cat(origin_at(base, root).str(), ": expected a map with the sections ",
                            join(section_names()), ", got ", config::describe(root)));
    for_each_pair(root, base, "", [&](const std::string& name, const YAML::Node& value, const Origin& at) {
      section(name, value, base, at);
    });
  }

  void override_arg(const std::string& arg) {
    Origin o;
    o.file = in_.file;
    o.set = arg;
    const size_t eq = arg.find('=');
    if (eq == std::string::npos)
      throw input_error(cat(o.str(), ": expected key.path=value (e.g. optimizer.lr=0.01)"));
    const std::string path = arg.substr(0, eq);
    if (path.empty()) throw input_error(cat(o.str(), ": the key path before '=' is empty"));
    const YAML::Node value = parse_value(arg.substr(eq + 1), o, path);
    std::vector<std::string> parts;
    std::stringstream ss(path);
    for (std::string part; std::getline(ss, part, '.');) parts.push_back(part);
    if (path.back() == '.') parts.push_back("");
    const Section& s = checked_section(parts[0], o, parts[0]);
    if (parts.size() == 1) return section(s.name, value, o, o);
    if (parts.size() == 2) return entry(s, parts[1], value, o, o);
    if (parts.size() == 3 && s.name == "model" && parts[1] == "params")
      return param(parts[2], value, o, /*bare=*/false);
    if (s.name != "model" && !config::find_key(s, parts[1])) throw unknown_key(s, parts[1], o);
    throw input_error(
        cat(o.str(), ": ", abbreviate(path), ": ", s.name, ".", abbreviate(parts[1]), " has no sub-keys"));
  }

 private:
  static YAML::Node parse_value(const std::string& text, const Origin& o, const std::string& path) {
    try {
      return load_yaml(text);
    } catch (const YamlRefused& e) {
      throw input_error(cat(o.str(), ": ", path, ": ", e.msg));
    } catch (const YAML::Exception& e) {
      throw input_error(cat(o.str(), ": ", path, ": the value is not valid YAML: ", e.msg));
    }
  }

  // Calls fn(key, value, origin of the key) for each pair of `map` (whose key path is `path`), after
  // checking that the key is a scalar and not a repeat.
  template <typename Fn>
  static void for_each_pair(const YAML::Node& map, const Origin& base, const std::string& path, Fn fn) {
    std::map<std::string, Origin> seen;
    for (auto it = map.begin(); it != map.end(); ++it) {
      const Origin at = origin_at(base, it->first);
      if (!it->first.IsScalar())
        throw input_error(cat(at.str(), ": ", path.empty() ? "" : path + ": ", "expected a key name, got ",
                              config::describe(it->first)));
      const std::string name = it->first.Scalar();
      const std::string key_path = path.empty() ? name : path + "." + name;
      if (auto first = seen.find(name); first != seen.end()) {
        const std::string where =
            first->second.line > 0 ? cat(" (first given at line ", first->second.line, ")") : std::string();
        throw input_error(cat(at.str(), ": ", abbreviate(key_path), ": duplicate key", where));
      }
      seen.emplace(name, at);
      fn(name, it->second, at);
    }
  }

  const Section& checked_section(const std::string& name, const Origin& at, const std::string& path) {
    const Section* s = config::find_section(name);
    if (!s)
      throw input_error(cat(at.str(), ": ", abbreviate(path), ": unknown section '", abbreviate(name), "'",
                            config::did_you_mean(name, section_names())));
    return *s;
  }

  static Error unknown_key(const Section& s, const std::string& key, const Origin& at) {
    return input_error(cat(at.str(), ": ", s.name, ".", abbreviate(key), ": unknown key '", abbreviate(key),
                           "'", config::did_you_mean(key, key_names(s))));
  }

  // A value's origin; a missing value (`key:` alone) is reported at its key.
  static Origin value_origin(const Origin& base, const YAML::Node& value, const Origin& key_at) {
    return value.IsNull() ? key_at : origin_at(base, value);
  }

  void section(const std::string& name, const YAML::Node& value, const Origin& base, const Origin& key_at) {
    const Section& s = checked_section(name, key_at, name);
    const Origin at = value_origin(base, value, key_at);
    in_.sections[name] = at;
    if (value.IsNull()) return;  // a section with every key commented out
    if (!value.IsMap()) {
      const char* hint =
          name == "model" && value.IsScalar() ? " (a zoo model is written model: {zoo: NAME})" : "";
      throw input_error(
          cat(at.str(), ": ", name, ": expected a map of keys, got ", config::describe(value), hint));
    }
    for_each_pair(value, base, name, [&](const std::string& key, const YAML::Node& v, const Origin& k_at) {
      entry(s, key, v, base, k_at);
    });
  }

  void entry(const Section& s, const std::string& key, const YAML::Node& value, const Origin& base,
             const Origin& key_at) {
    const std::string path = cat(s.name, ".", key);
    const Origin at = value_origin(base, value, key_at);
    if (s.name == "model") {
      record_model(value, key, base, key_at);
      if (key == "params") return params(value, base, at);
      if (!config::find_key(s, key)) {
        in_.bare_keys[key] = key_at;
        return param(key, value, at, /*bare=*/true);
      }
    } else if (!config::find_key(s, key)) {
      throw unknown_key(s, key, key_at);
    }
    in_.values[path] = Given{value, at};
  }

  // `model.params`: merged parameter by parameter, so `--set model.params.width=8` keeps the others.
  void params(const YAML::Node& value, const Origin& base, const Origin& at) {
    in_.sections["model.params"] = at;
    if (!value.IsMap())
      throw input_error(
          cat(at.str(), ": model.params: expected a map of parameters, got ", config::describe(value)));
    for (auto it = value.begin(); it != value.end(); ++it)
      param(it->first.Scalar(), it->second, origin_at(base, it->second), /*bare=*/false);
  }

  void param(const std::string& name, const YAML::Node& value, const Origin& at, bool bare) {
    in_.model_params[name] = Given{value, at};
    in_.model_origins[bare ? name : "params." + name] = at;
  }

  // Origins of the model section's nested nodes ("layers[2].linear.out"), for the model loader's
  // messages; also rejects duplicate keys inside layers.
  void record_model(const YAML::Node& node, const std::string& path, const Origin& base,
                    const Origin& key_at) {
    in_.model_origins[path] = value_origin(base, node, key_at);
    if (node.IsSequence()) {
      for (size_t i = 0; i < node.size(); ++i) record_model(node[i], cat(path, "[", i, "]"), base, key_at);
    } else if (node.IsMap()) {
      for_each_pair(node, base, "model." + path,
                    [&](const std::string& k, const YAML::Node& v, const Origin& at) {
                      record_model(v, path + "." + k, base, at);
                    });
    }
  }

  Input& in_;
};

// Line `index` (0-based) of `text`, or "" past the end.
std::string line_of(const std::string& text, int index) {
  std::istringstream lines(text);
  std::string line;
  for (int i = 0; std::getline(lines, line); ++i)
    if (i == index) return line;
  return "";
}

YAML::Node parse_file_text(const std::string& text, const std::string& name) {
  try {
    return load_yaml(text);
  } catch (const YamlRefused& e) {
    throw input_error(cat(name, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.msg));
  } catch (const YAML::Exception& e) {
    // yaml-cpp's message for a tab in indentation ("illegal map value") does not mention the tab.
    const std::string line = line_of(text, e.mark.line);
    const char* hint =
        line.find('\t') != std::string::npos ? " (tabs are not allowed in YAML indentation)" : "";
    throw input_error(
        cat(name, ":", e.mark.line + 1, ":", e.mark.column + 1, ": YAML syntax error: ", e.msg, hint));
  }
}

// The model parameters as one map node, and where the map came from.
void add_params(Input& in) {
  if (in.model_params.empty()) return;
  YAML::Node map(YAML::NodeType::Map);
  for (const auto& [name, given] : in.model_params) map[name] = given.node;
  auto at = in.sections.find("model.params");
  const Origin origin = at != in.sections.end() ? at->second : in.model_params.begin()->second.origin;
  in.values["model.params"] = Given{map, origin};
}

// Every schema key validated and stored, from the input or from its default.
void store_values(const Input& in, RunConfig& cfg) {
  Origin schema_origin;
  schema_origin.file = "the schema default";
  for (const auto& section : config::schema()) {
    for (const Key& key : section.keys) {
      const std::string path = cat(section.name, ".", key.name);
      const auto given = in.values.find(path);
      if (given != in.values.end()) {
        key.bind.store(cfg, config::convert(key, given->second.node, given->second.origin, path));
        cfg.origins[path] = given->second.origin;
      } else {
        key.bind.store(cfg, config::convert(key, YAML::Load(key.default_yaml), schema_origin, path));
      }
    }
  }
  for (const auto& [name, origin] : in.sections) cfg.origins[name] = origin;
}

YAML::Node resolve(const RunConfig& cfg) {
  YAML::Node root(YAML::NodeType::Map);
  for (const auto& section : config::schema()) {
    YAML::Node map(YAML::NodeType::Map);
    for (const Key& key : section.keys) {
      // A model is either a zoo name or inline layers: the resolved config names only the one in use.
      if (section.name == "model" && key.name == (cfg.model.zoo.empty() ? "zoo" : "layers")) continue;
      map[key.name] = config::to_yaml(key.bind.load(cfg));
    }
    root[section.name] = map;
  }
  return root;
}

RunConfig build(Input& in) {
  add_params(in);
  RunConfig cfg;
  cfg.file = in.file;
  store_values(in, cfg);
  config::check_model(cfg, in.bare_keys);
  cfg.model.origins = in.model_origins;
  config::fill_derived(cfg);
  config::check_consistency(cfg);
  cfg.resolved = resolve(cfg);
  return cfg;
}

}  // namespace

RunConfig load_config_text(const std::string& text, const std::string& name,
                           const std::vector<std::string>& overrides) {
  Input in;
  in.file = name;
  Reader reader(in);
  reader.file(parse_file_text(text, name));
  for (const auto& arg : overrides) reader.override_arg(arg);
  return build(in);
}

RunConfig load_config(const std::string& file, const std::vector<std::string>& overrides) {
  return load_config_text(read_yaml_file(file, "config"), file, overrides);
}

RunConfig config_from_resolved(const std::string& yaml_text, const std::string& name) {
  // The resolved config is an ordinary config whose derived values are already filled in.
  return load_config_text(yaml_text, name);
}

std::string dump_config(const RunConfig& cfg) {
  YAML::Emitter out;
  out << cfg.resolved;
  return cat(out.c_str(), "\n");
}

}  // namespace flowrun
