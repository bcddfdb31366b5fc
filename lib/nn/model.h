// Models from YAML: the zoo (models/<name>.yaml) and inline `model.layers`, built into graph nodes through
// the GraphBuilder. A model file declares parameters with defaults, and a layer list; values written
// `${expr}` are expressions over the parameters (see models/README.md), and `repeat` / `for` / `if`
// layers unroll or select sub-lists. See models/README.md for the layer reference.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "graph/builder.h"
#include "nn/expr.h"

namespace flowrun {

// How one parameter (or state) is initialised, resolved when the model is built.
struct InitSpec {
  std::string kind = "zeros";  // zeros | ones | normal | uniform | trunc_normal
  double a = 0.0, b = 0.0;     // normal: mean a, std b; uniform: [a, b)
};

// The model's graph inputs, given by the data: images (B, C, H, W) f32 with labels (B) i64, or text
// (B, T) i64 tokens with targets (B, T) i64.
struct ModelInputs {
  bool text = false;
  Shape x_shape;            // with the batch
  int64_t num_classes = 0;  // classes or vocabulary
  // > 0: the model is built for autoregressive decoding (flowrun generate): x (B, T) holds T new tokens at
  // the positions given by the input "position" (1) i64, each attention layer keeps a key/value cache of
  // cache_len positions as state (updated in place as a step runs), `seq_len` in the model file is
  // cache_len, and there is no y and no loss: the graph's output is "logits" (B, T, vocab).
  int64_t cache_len = 0;
};

struct BuiltModel {
  ValueId x = kNoValue, y = kNoValue;  // graph inputs named "x" and "y"
  ValueId logits = kNoValue;           // (B, classes) or (B, T, vocab)
  ValueId loss = kNoValue;             // graph output "loss": mean cross-entropy over the batch (ignore -100)
  std::map<std::string, InitSpec> init;  // param/state name -> how to initialise it
  int64_t num_params = 0;                // total trainable elements (tied weights counted once)
  std::string summary;                   // one line per layer: name, output shape, params (for `check`)
  std::map<std::string, ValueId> layers;  // top-level layer name (as in the summary) -> its output
  nn::Env
      env;  // the built-ins, parameters and `let` values the layers saw (Hugging Face name maps read them)
};

// Builds the forward graph of `cfg` (zoo or inline) for the given inputs. `training` selects dropout and
// batch statistics (false for eval programs: dropout is identity, batchnorm uses running statistics).
// `recompute` (train.recompute: none | blocks | full) picks the layers whose nodes form activation-recompute
// segments (Node::segment) in a training graph, besides those marked `recompute: true`.
// Errors in a zoo file or in the config's model section are input_errors with file:line:col and the key
// path ("models/gpt.yaml:12:7: layers[3].attention.heads: ...", or the config's origin for parameters).
BuiltModel build_model(Graph& g, const ModelConfig& cfg, const ModelInputs& in, bool training,
                       const std::string& recompute = "none");

// Fills every parameter/state tensor named in `init` from the run seed: the stream of a tensor is
// RngStream{seed, hash of its name}, so a parameter's initial value does not depend on build order.
void init_parameters(const std::map<std::string, InitSpec>& init, uint64_t seed,
                     const std::function<Tensor&(const std::string&)>& tensor);

// 1234567 -> "1,234,567" (parameter counts in the model summary and `flowrun plan`).
std::string with_commas(int64_t n);

// Names of the zoo models found in the zoo directory, with their one-line docs (for `flowrun models`).
std::vector<std::pair<std::string, std::string>> list_zoo(const std::string& zoo_dir);

// The zoo directory of `cfg`: cfg.zoo_dir, else $FLOWRUN_MODELS, else the build's FLOWRUN_MODELS_DIR.
std::string zoo_directory(const ModelConfig& cfg);

// The `params` section (the parameters' defaults) of cfg's zoo model file, read as build_model reads it;
// an input_error when cfg names no zoo model or its file is bad.
YAML::Node zoo_params(const ModelConfig& cfg);

// YAML text with each whole-scalar `${expr}` quoted, so that `{dim: ${d_model}}` parses (flow collections
// forbid '{', '}', '[', ']' and ',' in plain scalars). `inserted` (optional) receives, per 0-based line,
// the 0-based columns of the inserted quotes, to map parser positions back to the text as written.
std::string quote_expressions(const std::string& text, std::map<int, std::vector<int>>* inserted = nullptr);

}  // namespace flowrun
