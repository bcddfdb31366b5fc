// The run configuration: one typed struct per YAML section, filled from a config file plus `--set`
// overrides by the schema in schema.cc (the single source of truth for keys, types, defaults, constraints
// and the documentation printed by `flowrun check --schema`).
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace flowrun {

// Where a config value came from, for error messages: "cfg.yaml:14:9" or "--set optimizer.lr=fast".
struct Origin {
  std::string file;  // config file path as given (or zoo model file)
  int line = 0;      // 1-based; 0 when unknown
  int column = 0;    // 1-based
  std::string set;   // non-empty when the value came from `--set key=value` (the whole argument)
  std::string str() const;  // "file:line:col" or "--set key=value"
};

// The `model` section. Either `zoo: NAME` (models/NAME.yaml, with the other keys as the zoo model's
// parameters) or `layers: [...]` inline (with optional `params:`). The layer YAML is kept as nodes
// (with their marks) because the model loader (lib/nn) validates it against the layer registry.
struct ModelConfig {
  std::string zoo;           // zoo model name, or "" for inline layers
  std::string zoo_dir;       // where zoo models are looked up; "" in the config = $FLOWRUN_MODELS, else the
                             // build's models/ directory (FLOWRUN_MODELS_DIR), filled in by load_config
  YAML::Node params;         // map: parameter overrides (zoo) or inline `params:`
  YAML::Node layers;         // inline layers (sequence), or null
  std::string init;          // "" = the model's own scheme; else pytorch | gpt2 | kaiming
  // Key path inside the model section -> origin: "zoo", a zoo parameter "n_layer" (written under `model`) or
  // "params.n_layer", inline "layers[2].linear.out".
  std::map<std::string, Origin> origins;
};

struct DataConfig {
  std::string dataset =
      "fashion_mnist";   // a built-in name | hdf5 (custom file with x, y) | text | tokens | csv
  std::string path;      // the data file; built-in: default <data cache>/<dataset>.h5
  std::string val_path;  // optional separate validation file
  int64_t seq_len = 128;                  // text datasets: tokens per sample (context length)
  int64_t vocab_size = 0;             // tokens: the vocabulary (0 = llm.c's GPT-2 vocabulary for its files)
  std::string token_format = "auto";  // tokens: auto | uint16 (flat) | llmc (llm.c's header)
  std::string label;                  // csv: the label column's name
  bool shuffle = true;
  int64_t prefetch = 2;                   // batches prepared ahead by the loader thread (0 = synchronous)
  std::vector<double> mean;               // image normalisation (per channel); empty = dataset default
  std::vector<double> std;
  int64_t eval_batches = 0;               // validation batches per eval (0 = the whole split)
};

struct TrainConfig {
  int64_t steps = 1000;
  uint64_t seed = 0;
  int64_t batch_size = 64;                // global batch (samples per optimizer step)
  int64_t micro_batch_size = 0;           // 0 = batch_size / parallel.data (no accumulation)
  int64_t grad_accumulation = 0;          // 0 = derived: batch_size / (micro_batch_size * parallel.data)
  int64_t eval_batch_size = 0;            // 0 = batch_size (global: the same samples in any layout)
  int64_t log_every = 10;
  int64_t eval_every = 0;                 // 0 = only at the end
  int64_t checkpoint_every = 0;           // 0 = only at the end
  int64_t keep_checkpoints = 3;
  bool async_checkpoint = true;           // write checkpoints from a background thread
  bool sharded_checkpoints = false;       // every rank writes its own pieces (step_<n>.shards/rank_<r>.h5)
  double max_wall_time = 0.0;             // seconds; then checkpoint and exit 3 (0 = no budget)
  double clip_grad_norm = 0.0;            // 0 = no clipping
  std::string run_dir;                    // default runs/<config file stem>
  std::string device = "cpu";             // cpu | cuda
  bool cuda_graph = true;                 // cuda: replay the step as a CUDA graph
  std::string recompute = "none";         // none | blocks | full (activation recompute, graph/recompute.cc)
  int64_t threads = 0;                    // 0 = OpenMP default
  bool adapt_threads = true;              // fewer threads while that is faster (train/threads.h)
  bool eager = false;                     // run the graph node by node (CompileOptions::eager)
};

struct OptimizerConfig {
  std::string type = "adamw";  // sgd | adam | adamw
  double lr = 1e-3;
  double momentum = 0.0;       // sgd
  double dampening = 0.0;      // sgd
  bool nesterov = false;       // sgd
  double weight_decay = 0.0;   // sgd/adam: L2 added to the gradient; adamw: decoupled
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  bool decay_1d = false;       // apply weight decay to 1-d params (biases, norm scales) too
};

struct ScheduleConfig {
  std::string type = "constant";     // constant | step | cosine | linear
  int64_t warmup_steps = 0;          // linear warmup from 0 to lr, then the schedule
  double min_lr = 0.0;               // cosine/linear floor
  int64_t step_size = 0;             // step: decay every step_size steps ...
  std::vector<int64_t> milestones;   // ... or at these steps
  double gamma = 0.1;                // step: multiply by gamma at each decay
};

struct PrecisionConfig {
  std::string dtype = "fp32";          // fp32 | fp16 | bf16
  std::string loss_scale = "dynamic";  // dynamic | a positive number (fp16)
  std::string master_weights = "fp32";
  double initial_scale = 65536;        // fp16, dynamic
  int64_t growth_interval = 2000;      // fp16, dynamic
};

struct ParallelConfig {
  int64_t data = 1, tensor = 1, pipeline = 1, zero = 0, micro_batches = 1;
  double bucket_mb = 25;
};

struct RunConfig {
  std::string file;          // the config file as given
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  PrecisionConfig precision;
  ParallelConfig parallel;
  YAML::Node resolved;       // the whole config with every default filled in (what `check` prints and
                             // checkpoints store)
  // Adjustments made while loading that the user should hear about ("cfg.yaml:7:17: schedule.warmup_steps:
  // 2000 capped to ..."); the command line prints each as a warning.
  std::vector<std::string> notes;
  // Key path ("optimizer.lr") -> where its value came from; also each section given ("train").
  std::map<std::string, Origin> origins;

  // "cfg.yaml:14:9: optimizer.lr: " style prefix for an error about `key_path` (no origin -> "file: key: ").
  std::string where(const std::string& key_path) const;
};

// Parses `file`, applies `overrides` ("key.path=value", each value parsed as YAML and validated like the
// file's), validates everything and fills defaults. Throws input_error (exit 2) naming file:line:col and
// key path; unknown keys get "did you mean 'x'?".
RunConfig load_config(const std::string& file, const std::vector<std::string>& overrides = {});
// The same from YAML text (tests); `name` stands for the file name in messages.
RunConfig load_config_text(const std::string& text, const std::string& name,
                           const std::vector<std::string>& overrides = {});
// A config back from its resolved YAML (as stored in a checkpoint).
RunConfig config_from_resolved(const std::string& yaml_text, const std::string& name);
// The resolved config as YAML text, sections in schema order.
std::string dump_config(const RunConfig& cfg);
// Limits on what flowrun reads as YAML (config files, `--set` values, zoo model files).
constexpr size_t kMaxYamlBytes = size_t{1} << 20;  // a file: 1 MiB
constexpr size_t kMaxYamlNodes = 100000;           // nodes, each alias counted as a copy of its anchor

// A YAML construct flowrun refuses (a second document, a non-core tag, an alias expansion past
// kMaxYamlNodes nodes or 100 levels of nesting); `mark` is where it is.
class YamlRefused : public YAML::Exception {
 public:
  YamlRefused(const YAML::Mark& mark, const std::string& message) : YAML::Exception(mark, message) {}
};

// One YAML document from `text`: throws YamlRefused for a second document, a tag other than YAML's core
// ones (!!str, !!int, !!float, !!bool, !!null, !!seq, !!map), an alias inside its own anchor, or more than
// kMaxYamlNodes nodes or 100 levels of nesting once aliases are expanded (a "billion laughs", or a nesting
// that would overflow the stack of the recursive walkers); other YAML::Exceptions are syntax errors.
YAML::Node load_yaml(const std::string& text);
// The text of the YAML file `path` (`what` names it in errors: "config", "model"); input_error unless it is a
// regular file of at most kMaxYamlBytes.
std::string read_yaml_file(const std::string& path, const std::string& what);
// Whether a YAML scalar is a string as written: quoted ('1', "2") or tagged !!str, never a number or a
// boolean, whatever its text.
bool written_as_string(const YAML::Node& node);
// `text` cut to about `max` characters with "..." (values echoed in error messages).
std::string abbreviate(const std::string& text, size_t max = 60);

// Markdown reference of every key (type, default, constraint, doc), generated from the schema.
std::string schema_markdown();

}  // namespace flowrun
