// Autoregressive generation: the decoder's program cache and the sampling loop.
#include "train/generate.h"

#include <omp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <sstream>

#include "ckpt/checkpoint.h"
#include "ckpt/weights.h"
#include "data/dataset.h"
#include "graph/passes.h"
#include "nn/model.h"
#include "parallel/comm.h"
#include "train/program.h"

namespace flowrun {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// Steps below this many FLOPs run in one thread (Decoder::step).
constexpr double kInlineFlops = 2e7;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The forward program of cfg's model on `len` new tokens per sequence, with the key/value caches; `built`
// receives the model.
Program compile_decoder(const RunConfig& cfg, int64_t vocab, int64_t batch, int64_t len, int64_t context,
                        BuiltModel* built) {
  Graph g;
  ModelInputs in;
  in.text = true;
  in.x_shape = {batch, len};
  in.num_classes = vocab;
  in.cache_len = context;
  *built = build_model(g, cfg.model, in, false);
  CompileOptions o;
  o.device = device_of(cfg).kind;
  o.compute = compute_dtype(cfg.precision);
  o.loss = "";
  return compile(std::move(g), o);
}

// A checkpoint path as given, or the newest complete checkpoint of a run directory.
std::string resolve_checkpoint(const std::string& path) {
  if (path.empty())
    throw input_error(
        "--checkpoint: a checkpoint (.h5), a sharded checkpoint or a run directory is required");
  if (!fs::exists(path)) throw input_error(cat("--checkpoint: ", path, " does not exist"));
  const fs::path ckpts = fs::path(path) / "checkpoints";
  if (fs::is_directory(path) && fs::is_directory(ckpts)) {
    const std::string latest = find_latest_checkpoint(ckpts.string());
    if (latest.empty())
      throw input_error(cat("--checkpoint: run directory ", path, " has no complete checkpoint"));
    return latest;
  }
  return path;
}

}  // namespace

Decoder::Decoder(const RunConfig& cfg, int64_t vocab, int64_t batch, int64_t context, const Weights& weights,
                 const std::string& source)
    : cfg_(cfg), vocab_(vocab), batch_(batch), context_(context) {
  BuiltModel built;
  Executor& first = *program(1, &built).ex;
  const std::map<std::string, Tensor> params = weights(first.program(), built);
  const Mesh one = make_mesh(make_single_communicator(), 1);
  for (const std::string& name : persistent_names(first.program(), ValueKind::param)) {
    auto it = params.find(name);
    if (it == params.end())
      throw input_error(cat(source, ": parameter '", name,
                            "' of the model is missing (was it saved from another model or config?)"));
    scatter_value(first, name, it->second, one, cat(source, ": parameter"));
  }
}

Decoder::~Decoder() = default;

Decoder::Compiled& Decoder::program(int64_t len, BuiltModel* built) {
  auto it = by_len_.find(len);
  if (it != by_len_.end()) return it->second;
  // Every program reads the parameters and writes the caches of the first one.
  std::map<std::string, Tensor> shared;
  if (!by_len_.empty())
    for (const auto& [name, t] : by_len_.begin()->second.ex->persistent())
      if (name != "x" && name != "position") shared.emplace(name, t);
  const auto t0 = Clock::now();
  BuiltModel model;
  Compiled c;
  c.ex =
      std::make_unique<Executor>(compile_decoder(cfg_, vocab_, batch_, len, context_, built ? built : &model),
                                 device_of(cfg_), cfg_.train.seed, shared);
  c.ex->use_cuda_graphs(cfg_.train.cuda_graph);
  compile_seconds_ += seconds_since(t0);
  c.flops = step_flops(c.ex->program(), 1);
  compiled_.push_back(len);
  return by_len_.emplace(len, std::move(c)).first->second;
}

Tensor Decoder::step(const std::vector<int64_t>& tokens, int64_t len, int64_t position) {
  FR_CHECK(static_cast<int64_t>(tokens.size()) == batch_ * len, "step: ", tokens.size(), " tokens for ",
           batch_, " x ", len);
  FR_CHECK(position >= 0 && position + len <= context_, "step: positions [", position, ", ", position + len,
           ") outside the context of ", context_);
  const Compiled& c = program(len);
  Executor& ex = *c.ex;
  std::copy(tokens.begin(), tokens.end(), ex.tensor("x").data<int64_t>());
  ex.tensor("position").data<int64_t>()[0] = position;
  // A step of a few MFLOP (a small model's decode step) is shorter than waking the other threads for each of
  // its kernels: on 2 cores, 0.5 ms/token in one thread against 2.8-16 ms in two while the other core was
  // busy (kjv_gpt). Such steps run in one thread; larger ones in all of them.
  const int threads = omp_get_max_threads();
  if (device_of(cfg_).kind == DeviceKind::cpu && c.flops < kInlineFlops) omp_set_num_threads(1);
  ex.run();
  omp_set_num_threads(threads);
  return ex.output("logits");
}

int64_t sample_token(const float* logits, int64_t vocab, double temperature, int64_t top_k, double top_p,
                     double u) {
  if (temperature <= 0)
    return std::max_element(logits, logits + vocab) - logits;  // the first of equal maxima
  std::vector<int64_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  size_t keep = top_k > 0 ? std::min<size_t>(order.size(), static_cast<size_t>(top_k)) : order.size();
  std::vector<double> p(keep);
  const double top = logits[order[0]] / temperature;
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += p[i] = std::exp(logits[order[i]] / temperature - top);
  if (top_p < 1.0) {
    // The most likely tokens until they hold top_p of the probability (at least one).
    double mass = 0;
    size_t n = 0;
    while (n < keep && (n == 0 || mass < top_p * sum)) mass += p[n++];
    keep = n;
    sum = mass;
  }
  double acc = 0;
  for (size_t i = 0; i < keep; ++i) {
    acc += p[i];
    if (u * sum < acc) return order[i];
  }
  return order[keep - 1];  // u * sum rounded up to the total
}

std::string token_text(int64_t t, bool bytes) {
  return bytes ? std::string(1, static_cast<char>(t)) : cat(" ", t);
}

std::vector<int64_t> prompt_tokens(const std::string& prompt, int64_t vocab) {
  std::vector<int64_t> ids;
  if (vocab == 256) {
    for (unsigned char ch : prompt) ids.push_back(ch);
    return ids;
  }
  std::istringstream words(prompt);
  for (std::string w; words >> w;) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(w.c_str(), &end, 10);
    if (*end != '\0' || errno != 0 || v < 0 || v >= vocab)
      throw input_error(cat("--prompt: word ", ids.size() + 1, " '", w, "' is not a token id 0..", vocab - 1,
                            " (a model of ", vocab,
                            " tokens takes its prompt as token ids: use your tokenizer)"));
    ids.push_back(v);
  }
  return ids;
}

GenerateResult generate(const RunConfig& cfg, const GenerateOptions& opts,
                        const std::function<void(int64_t sample, const std::string& text)>& emit) {
  check_device(cfg);
  if (opts.num_samples < 1)
    throw input_error(cat("--num-samples must be at least 1, got ", opts.num_samples));
  if (opts.max_new_tokens < 0)
    throw input_error(cat("--max-new-tokens must be >= 0, got ", opts.max_new_tokens));
  if (!(opts.temperature >= 0) || !std::isfinite(opts.temperature))
    throw input_error(cat("--temperature must be >= 0 (0 = greedy), got ", opts.temperature));
  if (opts.top_k < 0) throw input_error(cat("--top-k must be >= 0 (0 = every token), got ", opts.top_k));
  if (!(opts.top_p > 0 && opts.top_p <= 1))
    throw input_error(cat("--top-p must be in (0, 1], got ", opts.top_p));
  const auto data = open_dataset(cfg.data);
  if (!data->spec().text)
    throw input_error(cat(cfg.where("data.dataset"), cfg.data.dataset,
                          " is not text: generation needs a model trained on text or tokens"));
  const int64_t vocab = data->spec().num_classes, context = cfg.data.seq_len;
  std::vector<int64_t> prompt = prompt_tokens(opts.prompt, vocab);
  if (prompt.empty()) throw input_error("--prompt is empty: generation starts from at least one token");
  const std::string path = resolve_checkpoint(opts.checkpoint);
  const auto weights = [&](const Program& p, const BuiltModel& m) {
    if (is_safetensors(path)) {
      spdlog::info("generating from {}", path);
      return import_weights(p, m, cfg.model, path, false);
    }
    CheckpointData ck = load_checkpoint(path);
    spdlog::info("generating from {} (step {})", path, ck.step);
    return std::move(ck.params);
  };

  const int64_t B = opts.num_samples;
  Decoder dec(cfg, vocab, B, context, weights, cat("checkpoint ", path));
  GenerateResult r;
  r.bytes = vocab == 256;
  // The sequences so far; a prompt longer than the context keeps its last `context` tokens.
  if (static_cast<int64_t>(prompt.size()) > context) {
    spdlog::warn("the prompt has {} tokens, the model's context {}: generating from its last {}",
                 prompt.size(), context, context);
    prompt.erase(prompt.begin(), prompt.end() - context);
  }
  std::vector<std::vector<int64_t>> seqs(static_cast<size_t>(B), prompt);
  r.tokens.resize(static_cast<size_t>(B));
  r.prompt_len = static_cast<int64_t>(prompt.size());

  // Fills the caches with the last `len` tokens of every sequence at positions 0..len-1; returns the logits.
  auto prefill = [&](int64_t len) {
    std::vector<int64_t> x;
    for (const auto& s : seqs) x.insert(x.end(), s.end() - len, s.end());
    return dec.step(x, len, 0);
  };
  const double compiled_before = dec.compile_seconds();
  auto t0 = Clock::now();
  Tensor logits = prefill(r.prompt_len);
  r.prefill_seconds = seconds_since(t0) - (dec.compile_seconds() - compiled_before);
  int64_t pos = r.prompt_len, len = r.prompt_len;  // the next position; the length of the last step
  for (int64_t n = 0; n < opts.max_new_tokens; ++n) {
    std::vector<int64_t> next(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) {
      // One stream per sample, indexed by the token's place: the same seed gives the same text.
      const double u = RngStream{opts.seed, mix_stream(0x67656e, static_cast<uint64_t>(b))}.uniform(
          static_cast<uint64_t>(n));
      const float* row = logits.data<float>() + ((b * len) + len - 1) * vocab;
      const int64_t t = sample_token(row, vocab, opts.temperature, opts.top_k, opts.top_p, u);
      next[static_cast<size_t>(b)] = t;
      seqs[static_cast<size_t>(b)].push_back(t);
      r.tokens[static_cast<size_t>(b)].push_back(t);
      emit(b, token_text(t, r.bytes));
    }
    if (n + 1 == opts.max_new_tokens) break;
    if (pos == context) {
      // The context is full: the window slides, its last 3/4 prefilled again at positions 0.. (the model
      // knows no position past its training context), which leaves a quarter for single-token steps.
      len = std::max<int64_t>(1, context - context / 4);
      const double compiled = dec.compile_seconds();
      t0 = Clock::now();
      logits = prefill(len);
      r.slide_seconds += seconds_since(t0) - (dec.compile_seconds() - compiled);
      pos = len;
      ++r.slides;
      continue;
    }
    t0 = Clock::now();
    logits = dec.step(next, 1, pos);
    r.decode_seconds += seconds_since(t0);
    ++r.decode_steps;
    ++pos;
    len = 1;
  }
  r.compiled = dec.compiled();
  r.compile_seconds = dec.compile_seconds();
  return r;
}

}  // namespace flowrun
