// Weights exchanged with other tools as safetensors files (lib/io/safetensors.h): `flowrun export` of a
// checkpoint under flowrun's names or Hugging Face Transformers' (with a config.json the Transformers class
// loads), and the import behind `--init-from FILE.safetensors` / `eval --checkpoint FILE.safetensors`:
// names recognised as flowrun's or Hugging Face's, layouts transposed back, dtypes converted, shapes checked.
// The name maps are files beside the zoo: <zoo dir>/hf/<zoo model>.yaml (format in models/README.md).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/tensor.h"
#include "nn/expr.h"

namespace flowrun {

// One zoo model's map to Hugging Face names. Patterns hold `{i}` for a block index.
struct HfMap {
  std::string file;          // the map file, for messages
  std::string architecture;  // the Transformers class ("GPT2LMHeadModel")
  std::string base_prefix;   // "transformer.": files of the base model alone name tensors without it
  std::string config_json;   // config.json, its `${...}` evaluated over the model's values
  struct Rule {
    std::string flowrun, hf;
    bool transpose = false;  // 2-d weights stored (in, out) there (GPT-2's Conv1D)
  };
  std::vector<Rule> tensors;
  std::map<std::string, std::string> tied;  // hf pattern -> the flowrun parameter it is (not exported)
  std::vector<std::string> optional;        // flowrun patterns a Hugging Face file may lack
  std::vector<std::string> ignore;          // hf patterns skipped on import without a warning (buffers)
};

// The map of cfg's zoo model evaluated with `env` (BuiltModel::env), or nullopt when the model is inline or
// its zoo has no map file. A malformed map is an input_error naming the file and key.
std::optional<HfMap> load_hf_map(const ModelConfig& cfg, const nn::Env& env);

// A tensor the model wants from an imported file: its (whole) shape and dtype, and whether it may be
// missing (keeping its initial value) without the map saying so.
struct WantedTensor {
  Shape shape;
  DType dtype = DType::f32;
  bool optional = false;
};

// Reads a safetensors file into the model's tensors, by flowrun's names (the `flowrun_names` metadata that
// export writes, else detected: any tensor named as one of the model's) or by the model's Hugging Face map
// (with or without its base_prefix). Returns the tensors found, converted to the wanted dtype (F32, F16,
// BF16, F64 -> the parameter's) and transposed back. Every tensor of the wrong shape or kind and every
// missing one is listed in one input_error (exit 2); missing optional ones and the file's unused tensors
// are each named in a warning. `map` may be nullopt (then only flowrun's names are recognised).
std::map<std::string, Tensor> import_safetensors(const std::string& path,
                                                 const std::map<std::string, WantedTensor>& want,
                                                 const std::optional<HfMap>& map);

// A path that names a safetensors file (by its extension), rather than a flowrun checkpoint.
inline bool is_safetensors(const std::string& path) {
  return path.ends_with(".safetensors");
}

// `flowrun export CKPT --format safetensors --out DIR --names flowrun|hf`: DIR/model.safetensors (the
// checkpoint's parameters and running statistics, no optimizer state) and DIR/config.json (hf: the
// Transformers config of the map; flowrun: the resolved config), each replaced atomically. The checkpoint
// may be a sharded directory. hf names build the model (from the checkpoint's config and its data's shape)
// for its parameter values. Returns a line for the user.
std::string export_checkpoint(const std::string& checkpoint, const std::string& out_dir,
                              const std::string& format, const std::string& names);

}  // namespace flowrun
