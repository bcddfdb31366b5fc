// flowrun: the command-line front end. Parses arguments and calls the library; exit codes 0 ok,
// 1 runtime failure, 2 bad input.
#include <malloc.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "ckpt/checkpoint.h"
#include "ckpt/weights.h"
#include "config/config.h"
#include "config/schema.h"
#include "core/error.h"
#include "core/signals.h"
#include "core/terminal.h"
#include "data/dataset.h"
#include "nn/model.h"
#include "ops/listing.h"
#include "parallel/launch.h"
#include "train/generate.h"
#include "train/plan.h"
#include "train/profile.h"
#include "train/program.h"
#include "train/search.h"
#include "train/trainer.h"

namespace {

struct Args {
  std::string config, resume, init_from, run_dir, checkpoint, dataset, out, filter, diff, dump_step;
  double rtol = 1e-5;
  int64_t world_size = 0;
  std::vector<std::string> set;
  int64_t exit_at_step = 0;
  int64_t limit = 0;
  bool schema = false, plan = false, detect_anomaly = false, progress = false, no_progress = false, json = false;
  bool eager = false;  // train/eval/time --eager: train.eager
  flowrun::TimeOptions time;
  std::string export_format = "safetensors", export_names = "flowrun";  // flowrun export
  std::string dump;                                                     // flowrun eval --dump
  std::vector<std::string> layers;                                      // flowrun eval --layer
  flowrun::GenerateOptions gen;
  std::string prompt_file;
  bool search = false;  // flowrun plan --search
  std::string machine, memory, write_config;
  int64_t top = 5, threads = 0;
};

// A config with --set overrides and the command line's --run-dir applied.
flowrun::RunConfig load(const Args& a) {
  flowrun::RunConfig cfg = flowrun::load_config(a.config, a.set);
  for (const std::string& note : cfg.notes) std::cerr << "flowrun: warning: " << note << "\n";
  if (!a.run_dir.empty()) cfg.train.run_dir = a.run_dir;
  if (a.eager) cfg.train.eager = true;
  return cfg;
}

int run_train(const Args& a) {
  flowrun::TrainOptions o;
  o.resume = a.resume;
  o.init_from = a.init_from;
  o.exit_at_step = a.exit_at_step;
  o.progress = a.progress ? 1 : a.no_progress ? 0 : -1;
  o.detect_anomaly = a.detect_anomaly;
  o.dump_step = a.dump_step;
  const flowrun::TrainResult r = flowrun::train(load(a), o);
  return static_cast<int>(r.interrupted ? flowrun::ExitCode::stopped : flowrun::ExitCode::ok);
}

int run_eval(const Args& a) {
  const flowrun::RunConfig cfg = load(a);
  const flowrun::EvalResult e = flowrun::evaluate_checkpoint(cfg, a.checkpoint, {a.dump, a.layers});
  std::cout << "eval " << a.checkpoint << ": " << flowrun::eval_summary(e) << " over " << e.count
            << (e.text ? " tokens" : " samples") << "\n";
  // A loss that is not a number is no result: scripts comparing checkpoints must not take it for one.
  if (!std::isfinite(e.loss))
    throw flowrun::runtime_error(flowrun::cat(
        "eval ", a.checkpoint, ": the validation loss is ", e.loss,
        ", not finite: the checkpoint's weights diverged, or its values overflow precision.dtype"));
  return 0;
}

int run_check(const Args& a) {
  if (a.schema) {
    std::cout << flowrun::schema_markdown();
    return 0;
  }
  if (a.config.empty()) throw flowrun::input_error("check: a CONFIG file is required (or --schema)");
  const flowrun::RunConfig cfg = load(a);
  std::cout << flowrun::dump_config(cfg);
  // Building the model validates the model section against the zoo and the data's shapes.
  const auto data = flowrun::open_dataset(cfg.data);
  flowrun::Graph g;
  flowrun::ModelInputs in;
  in.text = data->spec().text;
  in.x_shape = {cfg.train.micro_batch_size};
  in.x_shape.insert(in.x_shape.end(), data->spec().sample_shape.begin(), data->spec().sample_shape.end());
  in.num_classes = data->spec().num_classes;
  const flowrun::BuiltModel m = flowrun::build_model(g, cfg.model, in, true);
  std::cout << "# model: " << m.num_params << " parameters\n";
  std::istringstream lines(m.summary);
  for (std::string line; std::getline(lines, line);) std::cout << "#   " << line << "\n";
  if (a.plan || cfg.precision.dtype != "fp32") {
    flowrun::BuiltModel built;
    const flowrun::Program p = flowrun::compile_model(cfg, data->spec(), cfg.train.micro_batch_size, true, &built);
    std::cout << "# training step in " << cfg.precision.dtype << " (" << p.order.size() << " kernels, arena "
              << p.memory.arena_bytes << " bytes):\n";
    std::istringstream plan(flowrun::describe_precision(p.graph, p.order, flowrun::DeviceKind::cpu, a.plan));
    for (std::string line; std::getline(plan, line);) std::cout << "#   " << line << "\n";
  }
  return 0;
}

int run_diff(const Args& a) {
  double worst = 0;
  const auto diffs = flowrun::compare_checkpoints(flowrun::load_checkpoint(a.checkpoint),
                                                  flowrun::load_checkpoint(a.diff), a.rtol, &worst);
  for (const std::string& d : diffs) std::cout << d << "\n";
  std::cout << (diffs.empty() ? "same within" : "DIFFERENT beyond") << " rtol " << a.rtol
            << " (largest relative difference " << worst << ")\n";
  return diffs.empty() ? 0 : 1;
}

int run_plan(Args a) {
  if (a.search) {
    flowrun::SearchOptions o;
    o.world = a.world_size;
    o.machine = a.machine;
    o.memory = a.memory.empty() ? 0 : flowrun::parse_bytes(a.memory, "--memory");
    o.write_config = a.write_config;
    o.top = a.top;
    std::cout << flowrun::search_layouts(a.config, a.set, o);
    return 0;
  }
  if (!a.memory.empty() || !a.write_config.empty())
    throw flowrun::input_error("plan: --memory and --write-config go with --search");
  if (a.world_size > 0) {
    // The world is the data axis times the others: plan the data-parallel width that fills it.
    const flowrun::RunConfig base = load(a);
    const int64_t others = base.parallel.tensor * base.parallel.pipeline;
    if (a.world_size % others != 0)
      throw flowrun::input_error(flowrun::cat("--world-size ", a.world_size, " is not a multiple of parallel.tensor x ",
                                              "parallel.pipeline = ", others));
    a.set.push_back(flowrun::cat("parallel.data=", a.world_size / others));
  }
  const flowrun::RunConfig cfg = load(a);
  flowrun::PlanReport r = flowrun::plan_layout(cfg);
  std::cout << r.table;
  if (!a.machine.empty()) {
    double seconds = 0;
    std::cout << "\n" << flowrun::describe_step_time(cfg, flowrun::load_machine_profile(a.machine), &seconds);
    r.json.insert(r.json.size() - 1, flowrun::cat(", \"predicted_step_ms\": ", seconds * 1e3));
  }
  if (a.json) std::cout << r.json << "\n";
  return 0;
}

int run_calibrate(const Args& a) {
  const std::string text = flowrun::calibrate_machine(a.out, a.threads);
  if (flowrun::detect_launch().rank == 0) std::cout << text << (a.out.empty() ? "" : "wrote " + a.out + "\n");
  return 0;
}

int run_time(const Args& a) {
  const flowrun::TimeReport r = flowrun::time_training(load(a), a.time);
  if (!r.lead) return 0;  // under mpirun/srun rank 0 reports
  std::cout << r.table;
  if (a.json) std::cout << r.json << "\n";
  return 0;
}

int run_data(const Args& a) {
  const std::string out = a.out.empty() ? flowrun::default_dataset_path(a.dataset) : a.out;
  if (a.limit > 0 && a.dataset != "fashion_mnist")
    throw flowrun::input_error(flowrun::cat("--limit: only fashion_mnist is cut to its first images, not ", a.dataset));
  flowrun::prepare_dataset(a.dataset, out, a.limit);
  std::cout << "wrote " << out << "\n";
  return 0;
}

int run_export(const Args& a) {
  std::cout << flowrun::export_checkpoint(a.checkpoint, a.out, a.export_format, a.export_names) << "\n";
  return 0;
}

// The prompt and every sample's tokens on stdout (one sample streams as it is made, several are printed as
// they finish, each under a header line); the timing summary on stderr, out of the text's way.
int run_generate(Args a) {
  if (!a.prompt_file.empty()) {
    std::ifstream in(a.prompt_file, std::ios::binary);
    if (!in) throw flowrun::input_error(flowrun::cat("--prompt-file: cannot read ", a.prompt_file));
    a.gen.prompt.assign(std::istreambuf_iterator<char>(in), {});
  }
  const flowrun::RunConfig cfg = load(a);
  const bool stream = a.gen.num_samples == 1;
  bool started = false;
  const auto emit = [&](int64_t, const std::string& text) {
    if (!stream) return;
    if (!started) std::cout << a.gen.prompt;
    started = true;
    std::cout << text << std::flush;
  };
  const flowrun::GenerateResult r = flowrun::generate(cfg, a.gen, emit);
  if (stream) {
    if (!started) std::cout << a.gen.prompt;  // no token was made (--max-new-tokens 0)
    std::cout << "\n";
  } else {
    for (size_t s = 0; s < r.tokens.size(); ++s) {
      std::cout << "--- sample " << s + 1 << " ---\n" << a.gen.prompt;
      for (int64_t t : r.tokens[s]) std::cout << flowrun::token_text(t, r.bytes);
      std::cout << "\n";
    }
  }
  std::cout.flush();
  const int64_t made = static_cast<int64_t>(r.tokens.size()) * a.gen.max_new_tokens;
  const double total = r.prefill_seconds + r.decode_seconds + r.slide_seconds;
  std::fprintf(
      stderr,
      "flowrun: %lld tokens (%zu sample%s) in %.3f s: %.1f tokens/s; prompt of %lld tokens prefilled in "
      "%.2f ms; decode %.3f ms/step over %lld steps; %zu programs compiled in %.2f s (step lengths",
      static_cast<long long>(made), r.tokens.size(), r.tokens.size() == 1 ? "" : "s", total,
      total > 0 ? static_cast<double>(made) / total : 0.0, static_cast<long long>(r.prompt_len),
      r.prefill_seconds * 1e3,
      r.decode_steps ? r.decode_seconds * 1e3 / static_cast<double>(r.decode_steps) : 0.0,
      static_cast<long long>(r.decode_steps), r.compiled.size(), r.compile_seconds);
  for (int64_t len : r.compiled) std::fprintf(stderr, " %lld", static_cast<long long>(len));
  std::fprintf(
      stderr, ")%s\n",
      r.slides
          ? flowrun::cat("; the context window slid ", r.slides, r.slides == 1 ? " time" : " times").c_str()
          : "");
  return 0;
}

int run_models(const Args&) {
  const char* env = std::getenv("FLOWRUN_MODELS");
  for (const auto& [name, doc] : flowrun::list_zoo(env ? env : FLOWRUN_MODELS_DIR))
    std::printf("%-12s %s\n", name.c_str(), doc.c_str());
  return 0;
}

// Log lines to `Sink`'s stream (stdout, or stderr where stdout carries the output). spdlog's default sink
// colours whenever the stream is a terminal, including the pseudo-terminal mpirun gives each rank: colour
// only for a person reading it.
template <typename Sink>
void log_to(int fd) {
  const auto colour =
      flowrun::interactive_terminal(fd) ? spdlog::color_mode::always : spdlog::color_mode::never;
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("", std::make_shared<Sink>(colour)));
}

}  // namespace

int main(int argc, char** argv) {
  // Before any other thread exists, so that all of them block the signals (core/signals.h says why).
  flowrun::route_signals();
  // Fixed malloc thresholds. glibc's default mmap threshold rises to the size of the last mapped block freed,
  // after which such blocks (a checkpoint's copies, the dataset's reads) come from the heap and stay resident
  // once freed: the quickstart peaked at 95.0 MiB with it, 93.7 with 128 KiB (Zen 3 host). Blocks under 1 MiB
  // come from the heap: oneDNN's bf16 gemm kernel (the weight-gradient tiles on AMX, dnnl_matmul.cc) mallocs
  // a 404 KiB packing buffer at every call, which, mapped afresh each time under a 128 KiB threshold, faulted
  // in 47 MB of zeroed pages a gpt-tiny bf16 step (12,000 page faults; the step 84 -> 66 ms without them on a
  // Sapphire Rapids-class host; the quickstart's peak 91.5 -> 92.0 MiB). The heap's top is trimmed past
  // 2 MiB, twice the mmap threshold, as glibc's own rule sets it.
  mallopt(M_MMAP_THRESHOLD, 1024 * 1024);
  mallopt(M_TRIM_THRESHOLD, 2 * 1024 * 1024);
  flowrun::process_baseline_bytes();  // before any work: the baseline `plan` predicts a process from
  log_to<spdlog::sinks::stdout_color_sink_mt>(STDOUT_FILENO);
  CLI::App app{"flowrun: train deep-learning models from a YAML config on CPUs and GPUs"};
  app.require_subcommand(1);
  Args a;

  auto* train = app.add_subcommand("train", "Train the model of CONFIG; writes metrics.jsonl and checkpoints/ "
                                            "to the run directory");
  train->add_option("config", a.config, "YAML config file")->required();
  train->add_option("--set", a.set, "Override a config value: key.path=value (repeatable)");
  train->add_option("--resume", a.resume,
                    "Continue a run: 'auto' (newest complete checkpoint of the run directory, or a fresh start "
                    "when there is none) or a checkpoint path");
  train
      ->add_option(
          "--init-from", a.init_from,
          "Start a new run from the parameters of a checkpoint (fine-tuning), or of a .safetensors file "
          "(flowrun's names, or Hugging Face's for gpt, llama and bert: models/hf/)")
      ->excludes("--resume");
  train->add_option("--run-dir", a.run_dir, "Run directory (default: train.run_dir, else runs/<config name>)");
  train->add_option("--exit-at-step", a.exit_at_step,
                    "Save a checkpoint and exit cleanly after N steps (the schedule still follows train.steps)")
      ->check(CLI::PositiveNumber);
  train->add_flag("--detect-anomaly", a.detect_anomaly,
                  "Check every op's outputs each step (slower) and stop at the first inf/NaN, naming the op");
  train->add_option(
      "--dump-step", a.dump_step,
      "Write the run's first optimizer step to this HDF5 file: the batch (x, y), the loss, every "
      "parameter before the step and its gradient (the batch mean, before clipping); the "
      "checkpoint after the step holds the updated weights (scripts/check_parity.py compares "
      "them with PyTorch). One process, fp32 or bf16");
  train->add_flag(
      "--eager", a.eager,
      "Run the step node by node (train.eager): unfused, unplanned, every value in memory of its "
      "own; stops at the first op to make an inf/NaN, naming it and its inputs; prints the time per "
      "op at the end. The same losses and weights, bit for bit, as the compiled step");
  train->add_flag("--progress", a.progress, "Always draw the live progress line");
  train->add_flag("--no-progress", a.no_progress, "Plain log lines instead of the live progress line");

  auto* eval = app.add_subcommand("eval", "Loss and accuracy (perplexity for text) of a checkpoint on the "
                                          "validation split of CONFIG's data");
  eval->add_option("config", a.config, "YAML config file")->required();
  eval->add_option(
          "--checkpoint", a.checkpoint,
          "Checkpoint to evaluate: .h5, a sharded .shards directory, or a .safetensors file (flowrun's "
          "or Hugging Face names, as --init-from reads it)")
      ->required();
  eval->add_option("--dump", a.dump,
                   "Also write the evaluated batches to this HDF5 file: x, logits and each --layer's output "
                   "(layer/<NAME>), the batches concatenated (limit them with --set data.eval_batches=N)");
  eval->add_option("--layer", a.layers,
                   "A top-level layer whose output --dump writes, named as `flowrun check` lists the layers "
                   "(repeatable; e.g. bert's `layer`: the encoder's final hidden states)");
  eval->add_option("--set", a.set, "Override a config value: key.path=value (repeatable)");
  eval->add_flag(
      "--eager", a.eager,
      "Evaluate node by node (train.eager): every op's outputs checked for inf/NaN, and the time per "
      "op printed");

  auto* check = app.add_subcommand("check", "Validate CONFIG and print it fully resolved (defaults filled in), "
                                            "with the model's parameter count");
  check->add_option("config", a.config, "YAML config file");
  check->add_option("--set", a.set, "Override a config value: key.path=value (repeatable)");
  check->add_flag("--schema", a.schema, "Print the reference of every config key (markdown) instead");
  check->add_flag("--plan", a.plan,
                  "Also compile the training step and list its kernels: op, dtype, native or widened (f16/bf16 "
                  "through the f32 kernel), in schedule order (a summary is printed whenever precision.dtype is "
                  "not fp32)");

  auto* time = app.add_subcommand("time", "Time CONFIG's training step: median step time, throughput, GFLOP/s, "
                                          "memory, and per-layer forward/backward and per-op breakdowns");
  time->add_option("config", a.config, "YAML config file")->required();
  time->add_option("--set", a.set, "Override a config value: key.path=value (repeatable)");
  time->add_option("--steps", a.time.steps, "Timed optimizer steps (default 20)")->check(CLI::PositiveNumber);
  time->add_option("--warmup", a.time.warmup, "Untimed steps first (default 3)")->check(CLI::NonNegativeNumber);
  time->add_option("--profile", a.time.profile, "Steps timed kernel by kernel for the breakdown (default 5)")
      ->check(CLI::NonNegativeNumber);
  time->add_option("--nodes", a.time.nodes,
                   "Also list the N slowest nodes of the profiled steps, with their input and output types")
      ->check(CLI::NonNegativeNumber);
  time->add_flag("--json", a.json, "Also print the numbers as one JSON object (the last line)");
  time->add_flag("--eager", a.eager,
                 "Time the eager step (train.eager): node by node, unfused, unplanned, every op checked for "
                 "inf/NaN");

  auto* plan = app.add_subcommand("plan", "Without running: per-device memory (parameters, optimizer state, "
                                          "arena), FLOPs per step and collective traffic of CONFIG's layout");
  plan->add_option("config", a.config, "YAML config file")->required();
  plan->add_option("--set", a.set, "Override a config value: key.path=value (repeatable)");
  plan->add_option("--world-size", a.world_size,
                   "Plan for N processes: parallel.data = N / (tensor x pipeline)")
      ->check(CLI::PositiveNumber);
  plan->add_flag("--json", a.json, "Also print the numbers as one JSON object (the last line)");
  plan->add_flag("--search", a.search,
                 "Search the layouts of --world-size devices (data x tensor x pipeline, micro-batches, ZeRO "
                 "stage, recompute): drop those over the memory of a device, rank the rest by predicted step "
                 "time, print the best and why each other tensor x pipeline family lost");
  plan->add_option("--machine", a.machine,
                   "Machine profile (YAML: configs/machines/, or `flowrun calibrate --out`) for --search and "
                   "the predicted step time (default for --search: the shipped one of train.device)");
  plan->add_option("--memory", a.memory, "--search: memory per device (e.g. 2GiB; default: the profile's)");
  plan->add_option("--write-config", a.write_config, "--search: write the chosen layout as a config file");
  plan->add_option("--top", a.top, "--search: layouts shown (default 5)")->check(CLI::PositiveNumber);

  auto* inspect = app.add_subcommand("inspect", "Show a checkpoint: step, config, tensors, optimizer state, "
                                                "and verify its checksums");
  inspect->add_option("checkpoint", a.checkpoint, "Checkpoint (.h5)")->required();
  inspect->add_option("--diff", a.diff,
                      "Compare with another checkpoint instead: every parameter and state tensor, max |a - b| "
                      "relative to the tensor's max |a|; exit 1 when one exceeds --rtol");
  inspect->add_option("--rtol", a.rtol, "Tolerance of --diff (default 1e-5)")->check(CLI::PositiveNumber);

  auto* data = app.add_subcommand("data", "Convert a real dataset from its Debian package into HDF5 "
                                          "(training does this on first use)");
  data->add_option("dataset", a.dataset, "fashion_mnist | fashion_mnist_3x32 | kjv | wine | iris | breast_cancer")
      ->required()
      ->check(CLI::IsMember(flowrun::builtin_datasets()));
  data->add_option("--out", a.out,
                   "Output file (default: the data cache: $FLOWRUN_DATA, else $XDG_CACHE_HOME/flowrun, else "
                   "~/.cache/flowrun)");
  data->add_option("--limit", a.limit,
                   "fashion_mnist: keep only the first N images of each split (a small copy for quick runs and "
                   "machines without the Debian package)")
      ->check(CLI::PositiveNumber);

  auto* exp = app.add_subcommand("export",
                                 "Write a checkpoint's weights for other tools: DIR/model.safetensors "
                                 "and DIR/config.json (--names hf: Hugging Face Transformers' names, "
                                 "layouts and config, for gpt, llama and bert)");
  exp->add_option("checkpoint", a.checkpoint, "Checkpoint (.h5 file or sharded .shards directory)")
      ->required();
  exp->add_option("--out", a.out, "Output directory (created if missing)")->required();
  exp->add_option("--format", a.export_format, "File format (default safetensors)")
      ->check(CLI::IsMember({"safetensors"}));
  exp->add_option("--names", a.export_names,
                  "flowrun (the checkpoint's names; config.json = the resolved config) or hf (Hugging Face: "
                  "GPT2LMHeadModel, LlamaForCausalLM, BertForMaskedLM, by the map in models/hf/)")
      ->check(CLI::IsMember({"flowrun", "hf"}));

  auto* generate = app.add_subcommand(
      "generate",
      "Sample text from a trained decoder (gpt, llama): a key/value cache, one compiled program per "
      "step shape; the text on stdout, tokens/s on stderr");
  generate
      ->add_option("config", a.config,
                   "YAML config file (the model and data the checkpoint was trained with)")
      ->required();
  generate
      ->add_option("--checkpoint", a.gen.checkpoint,
                   "Checkpoint (.h5), sharded checkpoint (step_N.shards), run directory (its newest) or "
                   "model.safetensors (flowrun's or Hugging Face names)")
      ->required();
  generate->add_option("--set", a.set, "Override a config value: key.path=value (repeatable)");
  generate->add_option(
      "--prompt", a.gen.prompt,
      "Start of the text (default: a newline); a model with more than 256 tokens takes token ids "
      "separated by spaces");
  generate->add_option("--prompt-file", a.prompt_file, "Read the prompt from this file instead")
      ->excludes("--prompt");
  generate
      ->add_option("--max-new-tokens", a.gen.max_new_tokens, "Tokens to generate per sample (default 256)")
      ->check(CLI::NonNegativeNumber);
  generate
      ->add_option("--temperature", a.gen.temperature,
                   "Divide the logits by this before sampling; 0 = greedy (default 1)")
      ->check(CLI::NonNegativeNumber);
  generate
      ->add_option("--top-k", a.gen.top_k, "Sample among the k most likely tokens only; 0 = all (default 0)")
      ->check(CLI::NonNegativeNumber);
  generate
      ->add_option("--top-p", a.gen.top_p,
                   "Sample among the most likely tokens holding this much probability (default 1)")
      ->check(CLI::Range(0.0, 1.0));
  generate->add_option("--seed", a.gen.seed, "Sampling seed: the same seed gives the same text (default 1)");
  generate->add_option("--num-samples", a.gen.num_samples, "Samples drawn together as one batch (default 1)")
      ->check(CLI::PositiveNumber);
  auto* calibrate = app.add_subcommand(
      "calibrate",
      "Measure this machine's profile for `plan --search`: GEMM FLOP/s (fp32, bf16, fp16), memory bandwidth, "
      "the per-kernel overhead, and, under mpirun -np N, all-reduce latency and bandwidth between the ranks");
  calibrate->add_option("--out", a.out, "Write the profile (YAML) to this file");
  calibrate->add_option("--threads", a.threads, "Threads per rank (default: OpenMP's)")
      ->check(CLI::PositiveNumber);
  auto* models = app.add_subcommand("models", "List the model zoo");
  auto* version = app.add_subcommand("version", "Print the flowrun version");
  auto* ops = app.add_subcommand("ops", "List every registered op with the devices and dtypes its kernels cover");
  ops->add_option("filter", a.filter, "Only ops whose name contains this text");

  // CLI11 would answer a mistyped verb with "A subcommand is required": name it, with the closest verb.
  if (argc >= 2 && argv[1][0] != '-') {
    std::vector<std::string> verbs;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
      verbs.push_back(sub->get_name());
    if (std::find(verbs.begin(), verbs.end(), argv[1]) == verbs.end()) {
      std::cerr << "flowrun: error: unknown command '" << argv[1] << "'"
                << flowrun::config::did_you_mean(argv[1], verbs) << "; the commands are";
      for (const std::string& v : verbs) std::cerr << " " << v;
      std::cerr << " (flowrun --help)\n";
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  try {
    if (*train) return run_train(a);
    if (*eval) return run_eval(a);
    if (*check) return run_check(a);
    if (*time) return run_time(a);
    if (*plan) return run_plan(a);
    if (*calibrate) return run_calibrate(a);
    if (*inspect) return a.diff.empty() ? (std::cout << flowrun::describe_checkpoint(a.checkpoint), 0) : run_diff(a);
    if (*data) return run_data(a);
    if (*exp) return run_export(a);
    if (*models) return run_models(a);
    if (*generate) {
      log_to<spdlog::sinks::stderr_color_sink_mt>(STDERR_FILENO);  // stdout is the text
      if (a.gen.prompt.empty() && a.prompt_file.empty()) a.gen.prompt = "\n";
      return run_generate(a);
    }
    if (*version) std::cout << "flowrun " << FLOWRUN_VERSION << "\n";
    if (*ops) std::cout << flowrun::list_ops(a.filter);
  } catch (const flowrun::Error& e) {
    std::cerr << "flowrun: error: " << e.what() << "\n";
    return static_cast<int>(e.code());
  } catch (const std::exception& e) {
    std::cerr << "flowrun: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
