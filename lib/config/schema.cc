// The config schema table (every key: type, default, bounds, doc, RunConfig field) and the conversions
// and texts generated from it: validation messages, resolved values, the markdown reference.
#include "config/schema.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "core/error.h"

namespace flowrun::config {
namespace {

// --- building the table ---------------------------------------------------------------------------

// The binding of a key to `(cfg.*section).*member`; the member's C++ type picks the Value alternative.
template <typename S, typename T>
Binding field(S RunConfig::*section, T S::*member) {
  return {[section, member](RunConfig& c, const Value& v) { (c.*section).*member = std::get<T>(v); },
          [section, member](const RunConfig& c) { return Value((c.*section).*member); }};
}

Key key(const char* name, Type type, const char* default_yaml, Binding bind, const char* doc,
        Bounds bounds = {}) {
  Key k;
  k.name = name;
  k.type = type;
  k.default_yaml = default_yaml;
  k.bounds = bounds;
  k.doc = doc;
  k.bind = std::move(bind);
  return k;
}

Key choice(const char* name, std::vector<std::string> choices, const char* default_yaml, Binding bind,
           const char* doc) {
  Key k = key(name, Type::choice, default_yaml, std::move(bind), doc);
  k.choices = std::move(choices);
  return k;
}

constexpr Bounds positive{Bounds::positive};
constexpr Bounds non_negative{Bounds::non_negative};
constexpr Bounds unit_interval{Bounds::half_open, 0, 1};  // [0, 1)

std::vector<Section> build_schema() {
  using R = RunConfig;
  using M = ModelConfig;
  using D = DataConfig;
  using T = TrainConfig;
  using O = OptimizerConfig;
  using S = ScheduleConfig;
  using P = PrecisionConfig;
  using Par = ParallelConfig;
  const auto m = &R::model;
  const auto d = &R::data;
  const auto t = &R::train;
  const auto o = &R::optimizer;
  const auto s = &R::schedule;
  const auto p = &R::precision;
  const auto par = &R::parallel;
  return {
      {"model",
       "The network: a zoo model by name (`zoo`, with its parameters as further keys), or inline `layers`.",
       {
           key("zoo", Type::string, "\"\"", field(m, &M::zoo),
               "zoo model name (`<zoo_dir>/NAME.yaml`); every other key of `model` is one of its parameters"),
           key("layers", Type::layer_list, "null", field(m, &M::layers),
               "inline layer list, instead of `zoo` (see models/README.md)"),
           key("params", Type::param_map, "{}", field(m, &M::params),
               "parameters of inline layers (`${name}` in layer values); with `zoo`, parameter overrides"),
           choice("init", {"", "pytorch", "gpt2", "kaiming"}, "\"\"", field(m, &M::init),
                  "weight initialisation scheme; \"\" keeps the model's own"),
           key("zoo_dir", Type::string, "\"\"", field(m, &M::zoo_dir),
               "where zoo models live; \"\" = $FLOWRUN_MODELS, else the build's models/ directory"),
       }},
      {"data",
       "The dataset and its loader.",
       {
           choice(
               "dataset",
               {"fashion_mnist", "fashion_mnist_3x32", "kjv", "wine", "iris", "breast_cancer", "hdf5", "text",
                "tokens", "csv"},
               "fashion_mnist", field(d, &D::dataset),
               "built-in dataset; hdf5 for your own HDF5 file with arrays x and y; text (any file as bytes), "
               "tokens (nanoGPT's or llm.c's uint16 token files) or csv (a table with a header row) for your "
               "own file at `path` (lib/data/README.md)"),
           key("path", Type::string, "\"\"", field(d, &D::path),
               "the data file; \"\" = <data cache>/<dataset>.h5 for a built-in dataset (the cache: "
               "$FLOWRUN_DATA, else $XDG_CACHE_HOME/flowrun, else ~/.cache/flowrun), built on first use"),
           key("val_path", Type::string, "\"\"", field(d, &D::val_path),
               "separate validation file; \"\" = the split inside `path` (hdf5), its last 10% (text, tokens) "
               "or a seeded 20% of its rows (csv)"),
           key("seq_len", Type::integer, "128", field(d, &D::seq_len),
               "text datasets: tokens per sample (the context length)", positive),
           key("vocab_size", Type::integer, "0", field(d, &D::vocab_size),
               "tokens: the vocabulary size, every token below it; 0 = 50257 (GPT-2's, which llm.c's header "
               "version 1 means) for an llm.c file, required for a flat uint16 file",
               non_negative),
           choice("token_format", {"auto", "uint16", "llmc"}, "auto", field(d, &D::token_format),
                  "tokens: uint16 (flat little-endian, nanoGPT's train.bin), llmc (llm.c's 1024-byte header, "
                  "then uint16), auto = llmc when the file starts with llm.c's magic 20240520, else uint16"),
           key("label", Type::string, "\"\"", field(d, &D::label),
               "csv: the label column's name (integer classes 0, 1, ..., or text classes in sorted order); "
               "every other column is a numeric feature"),
           key("shuffle", Type::boolean, "true", field(d, &D::shuffle),
               "shuffle the training set every epoch"),
           key("prefetch", Type::integer, "2", field(d, &D::prefetch),
               "batches prepared ahead by the loader thread (0 = synchronous; a CPU run whose threads take "
               "every core prepares each batch when the step asks for it)",
               non_negative),
           key("mean", Type::number_list, "[]", field(d, &D::mean),
               "image normalisation mean, one per channel; [] = the dataset's default"),
           key("std", Type::number_list, "[]", field(d, &D::std),
               "image normalisation standard deviation, one per channel (as many as `mean`)", positive),
           key("eval_batches", Type::integer, "0", field(d, &D::eval_batches),
               "validation batches per evaluation (0 = the whole split)", non_negative),
       }},
      {"train",
       "The training loop: length, batches, logging, evaluation and checkpoints.",
       {
           key("steps", Type::integer, "1000", field(t, &T::steps), "optimizer steps to train", positive),
           key("seed", Type::count, "0", field(t, &T::seed),
               "seed of every random stream (initialisation, shuffling, dropout)"),
           key("batch_size", Type::integer, "64", field(t, &T::batch_size),
               "global batch: samples per optimizer step", positive),
           key("micro_batch_size", Type::integer, "0", field(t, &T::micro_batch_size),
               "samples per forward/backward pass and data-parallel rank; 0 = derived", non_negative),
           key("grad_accumulation", Type::integer, "0", field(t, &T::grad_accumulation),
               "micro-batches accumulated per step; 0 = derived; batch_size must equal micro_batch_size x "
               "grad_accumulation x parallel.data",
               non_negative),
           key("eval_batch_size", Type::integer, "0", field(t, &T::eval_batch_size),
               "samples per evaluation batch, in any layout (data.eval_batches counts these); 0 = batch_size",
               non_negative),
           key("log_every", Type::integer, "10", field(t, &T::log_every), "steps between metric logs",
               positive),
           key("eval_every", Type::integer, "0", field(t, &T::eval_every),
               "steps between evaluations (0 = only at the end)", non_negative),
           key("checkpoint_every", Type::integer, "0", field(t, &T::checkpoint_every),
               "steps between checkpoints (0 = only at the end)", non_negative),
           key("keep_checkpoints", Type::integer, "3", field(t, &T::keep_checkpoints),
               "checkpoints kept in the run directory (older ones are deleted)", positive),
           key("async_checkpoint", Type::boolean, "true", field(t, &T::async_checkpoint),
               "write checkpoints from a background thread: the step loop waits only for a snapshot copy"),
           key("sharded_checkpoints", Type::boolean, "false", field(t, &T::sharded_checkpoints),
               "under mpirun/srun every rank writes only the pieces it holds (step_<n>.shards/rank_<r>.h5, "
               "written synchronously, nothing gathered); they load under any layout"),
           key("max_wall_time", Type::number, "0.0", field(t, &T::max_wall_time),
               "seconds of training after which the run checkpoints and exits with code 3, as on SIGTERM or "
               "SIGUSR1 (0 = no budget)",
               non_negative),
           key("clip_grad_norm", Type::number, "0.0", field(t, &T::clip_grad_norm),
               "clip the global gradient norm to this (0 = no clipping)", non_negative),
           key("run_dir", Type::string, "\"\"", field(t, &T::run_dir),
               "where logs and checkpoints go; \"\" = runs/<config file name without extension>"),
           choice("device", {"cpu", "cuda"}, "cpu", field(t, &T::device),
                  "where to train: the CPU, or one GPU per process (see GPU in the README)"),
           key("cuda_graph", Type::boolean, "true", field(t, &T::cuda_graph),
               "cuda: record the step's kernels as a CUDA graph after its first run and replay it, one "
               "launch a step (false: launch kernel by kernel)"),
           key("threads", Type::integer, "0", field(t, &T::threads),
               "CPU threads (0 = the OpenMP default); with adapt_threads, the most a step uses",
               non_negative),
           key("adapt_threads", Type::boolean, "true", field(t, &T::adapt_threads),
               "CPU: run steps at fewer threads while that is faster (another busy process on the machine): "
               "now and then one step tries a neighbouring count; the same losses and weights, bit for bit, "
               "at any count (false: always train.threads)"),
           choice("recompute", {"none", "blocks", "full"}, "none", field(t, &T::recompute),
                  "activation recompute: layers whose activations are dropped after the forward pass and "
                  "computed again in the backward pass (the same losses and weights, bit for bit, for less "
                  "memory and about one more forward pass of time): none (only layers marked `recompute: "
                  "true`), blocks (every transformer_block and residual layer), full (every top-level layer "
                  "and each repeated one)"),
           key("eager", Type::boolean, "false", field(t, &T::eager),
               "run the graph node by node, unfused and unplanned, every value in memory of its own: each "
               "op's outputs are checked for inf/NaN as they are made (the error names the op and its "
               "inputs) and timed (a per-op table at the end); the same losses and weights, bit for bit, "
               "slower and with more memory (--eager)"),
       }},
      {"optimizer",
       "The optimizer and its hyper-parameters.",
       {
           choice("type", {"sgd", "adam", "adamw"}, "adamw", field(o, &O::type), "update rule"),
           key("lr", Type::number, "0.001", field(o, &O::lr), "peak learning rate", positive),
           key("momentum", Type::number, "0.0", field(o, &O::momentum), "sgd: momentum factor", non_negative),
           key("dampening", Type::number, "0.0", field(o, &O::dampening), "sgd: momentum dampening",
               Bounds{Bounds::closed, 0, 1}),
           key("nesterov", Type::boolean, "false", field(o, &O::nesterov),
               "sgd: Nesterov momentum (needs momentum > 0 and dampening 0)"),
           key("weight_decay", Type::number, "0.0", field(o, &O::weight_decay),
               "sgd/adam: L2 penalty added to the gradient; adamw: decoupled decay", non_negative),
           key("beta1", Type::number, "0.9", field(o, &O::beta1), "adam/adamw: first-moment decay",
               unit_interval),
           key("beta2", Type::number, "0.999", field(o, &O::beta2), "adam/adamw: second-moment decay",
               unit_interval),
           key("eps", Type::number, "1e-8", field(o, &O::eps), "adam/adamw: denominator epsilon", positive),
           key("decay_1d", Type::boolean, "false", field(o, &O::decay_1d),
               "apply weight decay to 1-d parameters (biases, norm scales) too"),
       }},
      {"schedule",
       "The learning-rate schedule.",
       {
           choice("type", {"constant", "step", "cosine", "linear"}, "constant", field(s, &S::type),
                  "shape of the learning rate after warmup"),
           key("warmup_steps", Type::integer, "0", field(s, &S::warmup_steps),
               "linear warmup from 0 to optimizer.lr (at most train.steps)", non_negative),
           key("min_lr", Type::number, "0.0", field(s, &S::min_lr),
               "cosine/linear: final learning rate (at most optimizer.lr)", non_negative),
           key("step_size", Type::integer, "0", field(s, &S::step_size),
               "step: decay every step_size steps (or give milestones)", non_negative),
           key("milestones", Type::integer_list, "[]", field(s, &S::milestones),
               "step: decay at these steps (strictly increasing)", positive),
           key("gamma", Type::number, "0.1", field(s, &S::gamma), "step: factor applied at each decay",
               positive),
       }},
      {"precision",
       "Numeric precision of the training step.",
       {
           choice("dtype", {"fp32", "fp16", "bf16"}, "fp32", field(p, &P::dtype),
                  "compute dtype of matmuls, convolutions and attention (and of the ops that follow them); "
                  "softmax, losses, norms and reductions stay fp32"),
           key("loss_scale", Type::loss_scale, "dynamic", field(p, &P::loss_scale),
               "fp16: dynamic (start at initial_scale, halve on inf/NaN gradients and skip the step, double "
               "after growth_interval good steps) or a fixed scale; bf16 and fp32 use none"),
           key("initial_scale", Type::number, "65536", field(p, &P::initial_scale),
               "fp16, dynamic: the first loss scale", positive),
           key("growth_interval", Type::integer, "2000", field(p, &P::growth_interval),
               "fp16, dynamic: finite steps in a row before the scale doubles", positive),
           choice("master_weights", {"fp32"}, "fp32", field(p, &P::master_weights),
                  "dtype of the weights the optimizer updates"),
       }},
      {"parallel",
       "How the run is split over devices (sizes of the device-mesh axes).",
       {
           key("data", Type::integer, "1", field(par, &Par::data),
               "data-parallel ranks (processes started by mpirun -np / srun -n; each takes 1/data of "
               "the batch)",
               positive),
           key("tensor", Type::integer, "1", field(par, &Par::tensor),
               "tensor-parallel ranks: layers split Megatron-style (column- then row-parallel linears, "
               "heads, vocabulary), derived by SBP deduction",
               positive),
           key("pipeline", Type::integer, "1", field(par, &Par::pipeline),
               "pipeline stages: the model cut into consecutive stages, one per rank, run 1F1B over "
               "parallel.micro_batches",
               positive),
           key("zero", Type::integer, "0", field(par, &Par::zero),
               "ZeRO stage over the data-parallel ranks: shard optimizer state (1), gradients (2), "
               "parameters (3: each gathered where the step reads it, in the forward and again in the "
               "backward pass)",
               Bounds{Bounds::closed, 0, 3}),
           key("bucket_mb", Type::number, "25", field(par, &Par::bucket_mb),
               "data parallel: gradient all-reduce bucket size in MiB; each bucket starts as soon as its "
               "gradients exist, overlapping the rest of the backward pass",
               positive),
           key("micro_batches", Type::integer, "1", field(par, &Par::micro_batches),
               "pipeline micro-batches per step (the accumulation window: train.grad_accumulation "
               "follows it)",
               positive),
       }},
  };
}

// --- scalars --------------------------------------------------------------------------------------

// A scalar typed by its text (see written_as_string).
bool plain(const YAML::Node& node) {
  return node.IsScalar() && !written_as_string(node);
}

std::optional<int64_t> parse_integer(const YAML::Node& node) {
  if (!plain(node)) return std::nullopt;
  std::string_view text = node.Scalar();
  if (!text.empty() && text[0] == '+') text.remove_prefix(1);
  int64_t v = 0;
  const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (err != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return v;
}

std::optional<uint64_t> parse_count(const YAML::Node& node) {
  if (!plain(node)) return std::nullopt;
  const std::string& text = node.Scalar();
  uint64_t v = 0;
  const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (err != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return v;
}

std::optional<double> parse_number(const YAML::Node& node) {
  if (!plain(node) || node.Scalar().empty()) return std::nullopt;
  const std::string& text = node.Scalar();
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// YAML 1.2 core booleans only: "yes"/"on" are strings, as in YAML 1.2.
std::optional<bool> parse_boolean(const YAML::Node& node) {
  if (!plain(node)) return std::nullopt;
  const std::string& t = node.Scalar();
  if (t == "true" || t == "True" || t == "TRUE") return true;
  if (t == "false" || t == "False" || t == "FALSE") return false;
  return std::nullopt;
}

// The shortest text that reads back as exactly `x`, always recognisable as a float ("1.0", "1e-08").
std::string format_number(double x) {
  char buf[64];
  const auto [end, err] = std::to_chars(buf, buf + sizeof buf, x);
  FR_CHECK(err == std::errc(), "cannot format ", x);
  std::string text(buf, end);
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

std::string bound_text(double x) {
  return cat(x);
}

// "integer" / "number" qualified by the bounds: "positive integer", "number in [0, 1)".
std::string bounded(const std::string& noun, const Bounds& b) {
  switch (b.kind) {
    case Bounds::any:
      return noun;
    case Bounds::positive:
      return "positive " + noun;
    case Bounds::non_negative:
      return "non-negative " + noun;
    case Bounds::half_open:
      return cat(noun, " in [", bound_text(b.lo), ", ", bound_text(b.hi), ")");
    case Bounds::closed:
      return cat(noun, " in [", bound_text(b.lo), ", ", bound_text(b.hi), "]");
  }
  return noun;
}

std::string with_article(const std::string& phrase) {
  const bool vowel = std::string("aeiou").find(phrase[0]) != std::string::npos;
  return (vowel ? "an " : "a ") + phrase;
}

std::string quoted_choice(const std::string& c) {
  return c.empty() ? "\"\"" : c;
}

std::string choice_list(const std::vector<std::string>& choices) {
  std::string out;
  for (const auto& c : choices) out += (out.empty() ? "" : ", ") + quoted_choice(c);
  return out;
}

}  // namespace

std::string Key::type_text() const {
  const Key& k = *this;
  switch (k.type) {
    case Type::integer:
      return bounded("integer", k.bounds);
    case Type::count:
      return "non-negative integer";
    case Type::number:
      return bounded("number", k.bounds);
    case Type::boolean:
      return "true or false";
    case Type::string:
      return "string";
    case Type::choice:
      return "one of " + choice_list(k.choices);
    case Type::number_list:
      return "list of " + bounded("number", k.bounds) + "s";
    case Type::integer_list:
      return "list of " + bounded("integer", k.bounds) + "s";
    case Type::loss_scale:
      return "positive number or dynamic";
    case Type::layer_list:
      return "list of layers";
    case Type::param_map:
      return "map of parameters";
  }
  return "";
}

namespace {

// --- conversion -----------------------------------------------------------------------------------

// Whether `node` is an integer too large for the key's type (int64, or uint64 for counts).
bool out_of_range(const Key& k, const YAML::Node& node) {
  if (!plain(node) || (k.type != Type::integer && k.type != Type::count)) return false;
  std::string_view text = node.Scalar();
  if (!text.empty() && text[0] == '+') text.remove_prefix(1);
  const char* end = text.data() + text.size();
  int64_t i = 0;
  uint64_t u = 0;
  const auto r =
      k.type == Type::count ? std::from_chars(text.data(), end, u) : std::from_chars(text.data(), end, i);
  return r.ec == std::errc::result_out_of_range && r.ptr == end;
}

Error invalid(const Key& k, const YAML::Node& node, const Origin& origin, const std::string& path) {
  std::string msg = cat(origin.str(), ": ", path, ": expected ", k.expected(), ", got ", describe(node));
  if (k.type == Type::choice && node.IsScalar()) msg += did_you_mean(node.Scalar(), k.choices);
  if (out_of_range(k, node))
    msg += k.type == Type::count ? " (out of range: at most 2^64-1)" : " (out of range: -2^63 to 2^63-1)";
  return input_error(msg);
}

template <typename T, typename Parse>
std::vector<T> convert_list(const Key& k, Type element_type, Parse parse, const YAML::Node& node,
                            const Origin& origin, const std::string& path) {
  if (!node.IsSequence()) throw invalid(k, node, origin, path);
  Key element = k;
  element.type = element_type;
  std::vector<T> out;
  for (size_t i = 0; i < node.size(); ++i) {
    const auto v = parse(node[i]);
    if (!v || !k.bounds.holds(static_cast<double>(*v)))
      throw invalid(element, node[i], origin_at(origin, node[i]), cat(path, "[", i, "]"));
    out.push_back(*v);
  }
  return out;
}

template <typename T>
Value checked(const Key& k, const std::optional<T>& v, const YAML::Node& node, const Origin& origin,
              const std::string& path) {
  if (!v || !k.bounds.holds(static_cast<double>(*v))) throw invalid(k, node, origin, path);
  return *v;
}

// Value -> resolved YAML; doubles as strings in their shortest exact form (yaml-cpp would print 17 digits).
struct ToYaml {
  YAML::Node operator()(int64_t v) const { return YAML::Node(v); }
  YAML::Node operator()(uint64_t v) const { return YAML::Node(v); }
  YAML::Node operator()(double v) const { return YAML::Node(format_number(v)); }
  YAML::Node operator()(bool v) const { return YAML::Node(v); }
  YAML::Node operator()(const std::string& v) const { return YAML::Node(v); }
  YAML::Node operator()(const std::vector<double>& v) const { return list(v); }
  YAML::Node operator()(const std::vector<int64_t>& v) const { return list(v); }
  YAML::Node operator()(const YAML::Node& v) const { return YAML::Clone(v); }

  template <typename T>
  YAML::Node list(const std::vector<T>& v) const {
    YAML::Node seq(YAML::NodeType::Sequence);
    for (const T& x : v) seq.push_back((*this)(x));
    seq.SetStyle(YAML::EmitterStyle::Flow);
    return seq;
  }
};

}  // namespace

bool Bounds::holds(double x) const {
  switch (kind) {
    case any:
      return true;
    case positive:
      return x > 0;
    case non_negative:
      return x >= 0;
    case half_open:
      return x >= lo && x < hi;
    case closed:
      return x >= lo && x <= hi;
  }
  return false;
}

std::string Key::expected() const {
  return type == Type::boolean || type == Type::choice ? type_text() : with_article(type_text());
}

const std::vector<Section>& schema() {
  static const std::vector<Section> sections = build_schema();
  return sections;
}

const Section* find_section(const std::string& name) {
  for (const auto& s : schema())
    if (s.name == name) return &s;
  return nullptr;
}

const Key* find_key(const Section& section, const std::string& name) {
  for (const auto& k : section.keys)
    if (k.name == name) return &k;
  return nullptr;
}

Origin origin_at(const Origin& base, const YAML::Node& node) {
  if (!base.set.empty() || node.Mark().line < 0) return base;
  Origin o;
  o.file = base.file;
  o.line = node.Mark().line + 1;
  o.column = node.Mark().column + 1;
  return o;
}

Value convert(const Key& k, const YAML::Node& node, const Origin& origin, const std::string& path) {
  switch (k.type) {
    case Type::integer:
      return checked(k, parse_integer(node), node, origin, path);
    case Type::count:
      return checked(k, parse_count(node), node, origin, path);
    case Type::number:
      return checked(k, parse_number(node), node, origin, path);
    case Type::boolean:
      return checked(k, parse_boolean(node), node, origin, path);
    case Type::string:
      if (!node.IsScalar()) throw invalid(k, node, origin, path);
      return node.Scalar();
    case Type::choice:
      if (!node.IsScalar() || std::find(k.choices.begin(), k.choices.end(), node.Scalar()) == k.choices.end())
        throw invalid(k, node, origin, path);
      return node.Scalar();
    case Type::number_list:
      return convert_list<double>(k, Type::number, parse_number, node, origin, path);
    case Type::integer_list:
      return convert_list<int64_t>(k, Type::integer, parse_integer, node, origin, path);
    case Type::loss_scale: {
      if (node.IsScalar() && node.Scalar() == "dynamic") return std::string("dynamic");
      const auto v = parse_number(node);
      if (!v || *v <= 0) throw invalid(k, node, origin, path);
      return node.Scalar();
    }
    case Type::layer_list:
      if (!node.IsNull() && !node.IsSequence()) throw invalid(k, node, origin, path);
      return node;
    case Type::param_map:
      if (!node.IsMap()) throw invalid(k, node, origin, path);
      return node;
  }
  FR_CHECK(false, "unhandled config type for ", path);
}

YAML::Node to_yaml(const Value& value) {
  return std::visit(ToYaml{}, value);
}

std::string describe(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing";
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a map";
  std::string text = cat("\"", abbreviate(node.Scalar()), "\"");
  // `lr: "0.1"` looks like a number but YAML reads a string: say why it was refused.
  YAML::Node unquoted(node.Scalar());
  if (!plain(node) && (parse_number(unquoted) || parse_boolean(unquoted)))
    text += node.Tag() == "!" ? " (quoted, so a string)" : " (tagged !!str, so a string)";
  return text;
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  // Levenshtein distance, the classic two-row dynamic programme.
  const auto distance = [](const std::string& a, const std::string& b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= b.size(); ++j)
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
      std::swap(prev, cur);
    }
    return prev[b.size()];
  };
  const std::string* best = nullptr;
  size_t best_d = 0;
  for (const auto& c : candidates) {
    const size_t d = distance(word, c);
    // Close means a couple of edits (more for long names), and not a rewrite of the whole candidate.
    const bool close = d <= std::max<size_t>(2, c.size() / 3) && d < c.size();
    if (close && (!best || d < best_d)) {
      best = &c;
      best_d = d;
    }
  }
  return best ? cat(" (did you mean '", *best, "'?)") : "";
}

}  // namespace flowrun::config

namespace flowrun {

std::string schema_markdown() {
  std::ostringstream md;
  md << "# flowrun config reference\n\n"
     << "Generated from the schema (lib/config/schema.cc). Every key is optional except `model`; "
     << "`--set section.key=value` overrides any of them.\n";
  for (const auto& section : config::schema()) {
    md << "\n## " << section.name << "\n\n"
       << section.doc << "\n\n"
       << "| key | type | default | description |\n|---|---|---|---|\n";
    for (const auto& k : section.keys) {
      md << "| `" << section.name << "." << k.name << "` | " << k.type_text() << " | `" << k.default_yaml
         << "` | " << k.doc << " |\n";
    }
  }
  return md.str();
}

}  // namespace flowrun
