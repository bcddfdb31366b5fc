// The model loader's internals (lib/nn): where a YAML node came from, typed access to a layer's options,
// the build context shared by the layer builders, and the layer registry.
#pragma once

#include <yaml-cpp/yaml.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "graph/builder.h"
#include "nn/expr.h"
#include "nn/model.h"

namespace flowrun::nn {

// The file a model's YAML came from, and the columns where quote_expressions inserted quotes, so that
// positions in messages are those of the file as written.
struct Source {
  std::string file;
  std::string fixed;                          // when set, the position of every node (a config origin)
  std::string path_prefix;                    // "model." for inline layers of a config file
  std::map<int, std::vector<int>> inserted;   // 0-based line -> 0-based columns of inserted quotes
  std::string at(const YAML::Mark& m) const;  // "file:line:col" (1-based), or "file" without a position
};

// An input_error that already names its position (so enclosing layers do not wrap it again).
class LocatedError : public Error {
 public:
  explicit LocatedError(const std::string& msg) : Error(ExitCode::bad_input, msg) {}
};

[[noreturn]] void fail(const Source& src, const YAML::Node& at, const std::string& path,
                       const std::string& msg);
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

// The value of a YAML node: `${expr}` evaluated, "a${b}c" interpolated, plain scalars typed (int, float,
// bool, else string), sequences as lists.
MValue to_value(const YAML::Node& n, const Env& env, const Source& src, const std::string& path);

// How a parameter or state is initialised, decided once the whole model is known (gpt2 scales residual
// projections by the number of transformer blocks).
struct ParamInfo {
  enum Role {
    weight,
    bias,
    embedding,
    position,
    gamma,
    beta,
    running_mean,
    running_var,
    kv_cache
  } role = weight;
  int64_t fan_in = 0, fan_out = 0;
  bool conv = false;      // conv weight (kaiming)
  bool residual = false;  // output projection of a residual branch (gpt2)
  std::optional<InitSpec> override_spec;

  static ParamInfo of(Role r, int64_t fan_in = 0, int64_t fan_out = 0, bool conv = false,
                      bool residual = false, std::optional<InitSpec> init = std::nullopt) {
    ParamInfo p;
    p.role = r;
    p.fan_in = fan_in, p.fan_out = fan_out, p.conv = conv, p.residual = residual,
    p.override_spec = std::move(init);
    return p;
  }
};

struct LayerDef;

// The most layer entries one model builds, counting every repeat/for iteration: several times the deepest
// real models (a ResNet-1202 is some 4000 entries), it stops `repeat: {times: ${n_layer}}` with an absurd
// n_layer within a second instead of exhausting time and memory.
constexpr int64_t kMaxLayers = 10000;

// The most elements of one tensor (parameter, state or layer output) and of all parameters together: 2^48
// is 1 PiB in fp32, beyond any machine, so an absurd size (a width of 2^40) is an input error, and byte
// sizes computed from these counts stay far from int64's limit instead of wrapping.
constexpr int64_t kMaxElements = int64_t{1} << 48;

// The element count of `shape`, or nothing when it overflows int64 (or a dimension is negative).
std::optional<int64_t> checked_numel(const Shape& shape);

struct Ctx {
  GraphBuilder b;
  Env env;
  const Source& src;
  bool training;
  std::vector<std::map<std::string, int>> counters{1};  // per scope: layer type -> next default index
  std::map<std::string, ValueId> saved;                 // `save` names
  std::map<std::string, ValueId> embeddings;            // embedding layer name -> table (for tied_head)
  std::map<std::string, ParamInfo> params;              // full name -> init role (params and state)
  std::set<std::string> trainable;                      // full names of trainable params
  int64_t num_params = 0;
  int transformer_blocks = 0;
  ValueId ids = kNoValue;      // the model's input token ids (text), for attention's key padding mask
  ValueId targets = kNoValue;  // set by mlm_mask: its labels replace the data's targets in the loss
  // Decoding with a key/value cache (ModelInputs::cache_len > 0): the input "position" (1) i64, the position
  // of x's first token, read at run time by the position embeddings and the cached attention.
  ValueId position = kNoValue;
  int64_t cache_len = 0;
  int64_t layers_built = 0;  // layer entries built so far, repeat/for iterations unrolled (kMaxLayers)
  std::string recompute = "none";  // train.recompute: which layers open a recompute segment (build_layer)
  int segments = 0;                // recompute segments opened so far
  // The layer being built, for errors raised by builders. A pointer: assigning to a yaml-cpp Node that
  // already refers to a node rewrites the referred node instead of rebinding.
  const YAML::Node* cur_node = nullptr;
  std::string cur_path;

  Ctx(Graph& g, const Source& s, bool train) : b(g), src(s), training(train) {}
  [[noreturn]] void fail(const std::string& msg) const {
    nn::fail(src, cur_node ? *cur_node : YAML::Node(), cur_path, msg);
  }
  void push_scope(const std::string& s) {
    b.push_scope(s);
    counters.emplace_back();
  }
  void pop_scope() {
    b.pop_scope();
    counters.pop_back();
  }
  // Fails unless a tensor of `shape` has at most kMaxElements (`what` names it: "the parameter 'fc/w'").
  void check_size(const std::string& what, const Shape& shape) const;
  ValueId param(const std::string& local, const Shape& shape, ParamInfo info);
  ValueId state(const std::string& local, const Shape& shape, ParamInfo info);
};

// A layer's options: validated names, typed getters with defaults; errors name the option's position.
class Opts {
 public:
  Opts(Ctx& ctx, const YAML::Node& map, const std::string& path, const LayerDef& def);
  bool has(const std::string& key) const {
    return map_.IsMap() && map_[key].IsDefined() && !map_[key].IsNull();
  }
  MValue value(const std::string& key) const;  // required
  int64_t integer(const std::string& key, std::optional<int64_t> dflt = {}, int64_t min = 1) const;
  double number(const std::string& key, std::optional<double> dflt = {}) const;
  double probability(const std::string& key, double dflt) const;  // in [0, 1)
  bool flag(const std::string& key, bool dflt) const;
  std::string text(const std::string& key, std::optional<std::string> dflt = {}) const;
  std::string choice(const std::string& key, const std::string& dflt,
                     const std::vector<std::string>& choices) const;
  std::vector<int64_t> pair(const std::string& key, std::optional<int64_t> dflt,
                            int64_t min) const;                           // n or [h, w]
  YAML::Node layers(const std::string& key, bool required = true) const;  // a raw layer list (built later)
  std::optional<InitSpec> init() const;                                   // the `init:` override, if given
  YAML::Node node(const std::string& key) const { return has(key) ? map_[key] : map_; }
  std::string path(const std::string& key) const { return cat(path_, ".", key); }
  [[noreturn]] void fail(const std::string& key, const std::string& msg) const;

 private:
  Ctx& ctx_;
  YAML::Node map_;
  std::string path_;
};

// One layer type: its options (besides `name`), and how it adds nodes (x -> output). `own_scope` layers
// put their parameters under "<name>/"; containers (repeat, for, if) and named-value layers do not.
struct LayerDef {
  std::string type;
  std::vector<std::string> options;
  std::string doc;
  bool own_scope = true;
  std::function<ValueId(Ctx&, const Opts&, const std::string& name, ValueId x)> build;
};

const std::map<std::string, LayerDef>& layer_registry();

// Builds one layer entry (`{type: {options}}` or a bare type name) at `path`; `anonymous` (the only layer
// of a repeat/for body) puts it directly in the enclosing scope. Returns the output and sets `name`.
ValueId build_layer(Ctx& ctx, const YAML::Node& entry, const std::string& path, ValueId x, bool anonymous,
                    std::string* name = nullptr);
// Builds a layer list in order (path names the list, e.g. "layers[2].repeat.layers").
ValueId build_layers(Ctx& ctx, const YAML::Node& list, const std::string& path, ValueId x,
                     bool anonymous_single);

// Resolves every parameter's InitSpec under `scheme` (pytorch | gpt2 | kaiming).
std::map<std::string, InitSpec> resolve_init(const Ctx& ctx, const std::string& scheme);

}  // namespace flowrun::nn
