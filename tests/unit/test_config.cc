// The run config: values and defaults, overrides, derived batch values, the resolved round trip, the
// schema reference, and every class of error with its file:line:col location (plus the bad-config corpus).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "config/config.h"
#include "config/schema.h"
#include "config_errors.h"
#include "core/error.h"
#include "nn/model.h"

namespace flowrun::testing {
namespace {

namespace fs = std::filesystem;

const std::string kConfigs = FLOWRUN_SOURCE_DIR "/tests/configs";

::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << part << "' not in:\n" << text;
}

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? setenv(name, value, 1) : unsetenv(name);
  }
  ~ScopedEnv() { old_ ? setenv(name_, old_->c_str(), 1) : unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

const std::string kZoo = "model:\n  zoo: mlp\n";

TEST(ConfigLoad, GoodConfigValuesAndDefaults) {
  ScopedEnv data("FLOWRUN_DATA", "/tmp/flowrun-data");
  const RunConfig cfg = load_config(kConfigs + "/good/minimal.yaml");
  EXPECT_EQ(cfg.model.zoo, "mlp");
  EXPECT_EQ(cfg.model.params["hidden"].as<int>(), 32);
  EXPECT_TRUE(cfg.model.layers.IsNull());
  EXPECT_EQ(cfg.data.dataset, "wine");
  EXPECT_EQ(cfg.data.path, "/tmp/flowrun-data/wine.h5");
  EXPECT_EQ(cfg.train.steps, 200);
  EXPECT_EQ(cfg.train.seed, 7u);
  EXPECT_EQ(cfg.train.batch_size, 16);
  EXPECT_EQ(cfg.train.run_dir, "runs/minimal");
  EXPECT_EQ(cfg.optimizer.type, "sgd");
  EXPECT_DOUBLE_EQ(cfg.optimizer.lr, 0.05);
  EXPECT_DOUBLE_EQ(cfg.optimizer.momentum, 0.9);
  // Defaults.
  EXPECT_EQ(cfg.train.device, "cpu");
  EXPECT_EQ(cfg.train.keep_checkpoints, 3);
  EXPECT_DOUBLE_EQ(cfg.optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(cfg.optimizer.eps, 1e-8);
  EXPECT_EQ(cfg.schedule.type, "constant");
  EXPECT_EQ(cfg.precision.loss_scale, "dynamic");
  EXPECT_EQ(cfg.parallel.data, 1);
  EXPECT_TRUE(cfg.data.shuffle);
  // Origins point at the values.
  EXPECT_EQ(cfg.origins.at("optimizer.lr").str(), kConfigs + "/good/minimal.yaml:13:7");
  EXPECT_EQ(cfg.model.origins.at("hidden").str(), kConfigs + "/good/minimal.yaml:4:11");
}

TEST(ConfigLoad, InlineModelKeepsLayersAndOrigins) {
  const RunConfig cfg = load_config(kConfigs + "/good/inline.yaml");
  EXPECT_TRUE(cfg.model.zoo.empty());
  ASSERT_TRUE(cfg.model.layers.IsSequence());
  EXPECT_EQ(cfg.model.layers.size(), 4u);
  EXPECT_EQ(cfg.model.layers[1]["linear"]["out"].Scalar(), "${width}");
  EXPECT_EQ(cfg.model.params["width"].as<int>(), 64);
  EXPECT_EQ(cfg.model.init, "kaiming");
  const std::string file = kConfigs + "/good/inline.yaml";
  EXPECT_EQ(cfg.model.origins.at("layers[1].linear.out").str(), file + ":8:14");
  EXPECT_EQ(cfg.model.origins.at("params.width").str(), file + ":4:12");
  EXPECT_EQ(cfg.data.mean, std::vector<double>{0.286});
  EXPECT_EQ(cfg.schedule.milestones, (std::vector<int64_t>{200, 400}));
  EXPECT_DOUBLE_EQ(cfg.optimizer.lr, 3e-4);
  EXPECT_EQ(cfg.precision.loss_scale, "1024");
}

// The schema's defaults (what the resolved config shows) agree with the struct initialisers in config.h,
// except for the values derived from others.
TEST(ConfigSchema, DefaultsMatchStructInitialisers) {
  const RunConfig loaded = load_config_text(kZoo, "cfg.yaml");
  const RunConfig plain;
  const std::vector<std::string> derived = {"model.zoo",
                                            "model.zoo_dir",
                                            "model.params",
                                            "model.layers",
                                            "data.path",
                                            "train.run_dir",
                                            "train.micro_batch_size",
                                            "train.grad_accumulation",
                                            "train.eval_batch_size"};
  int compared = 0;
  for (const auto& section : config::schema()) {
    for (const auto& key : section.keys) {
      const std::string path = section.name + "." + key.name;
      if (std::find(derived.begin(), derived.end(), path) != derived.end()) continue;
      YAML::Emitter a, b;
      a << config::to_yaml(key.bind.load(loaded));
      b << config::to_yaml(key.bind.load(plain));
      EXPECT_EQ(std::string(a.c_str()), std::string(b.c_str())) << path;
      ++compared;
    }
  }
  EXPECT_GT(compared, 40);
}

TEST(ConfigSchema, MarkdownMentionsEveryKey) {
  const std::string md = schema_markdown();
  for (const auto& section : config::schema()) {
    EXPECT_TRUE(Contains(md, "## " + section.name + "\n"));
    for (const auto& key : section.keys) EXPECT_TRUE(Contains(md, "`" + section.name + "." + key.name + "`"));
  }
  EXPECT_TRUE(Contains(md, "| `optimizer.lr` | positive number | `0.001` |"));
  EXPECT_TRUE(Contains(md, "| `optimizer.type` | one of sgd, adam, adamw | `adamw` |"));
  EXPECT_TRUE(Contains(md, "| `parallel.zero` | integer in [0, 3] | `0` |"));
  // Sections in schema order.
  EXPECT_LT(md.find("## model"), md.find("## data"));
  EXPECT_LT(md.find("## schedule"), md.find("## precision"));
  EXPECT_LT(md.find("## precision"), md.find("## parallel"));
}

TEST(ConfigOverrides, SetValuesAreParsedAsYamlAndLaterOnesWin) {
  const RunConfig cfg =
      load_config_text(kZoo + "optimizer:\n  lr: 0.1\n", "cfg.yaml",
                       {"optimizer.lr=0.5", "data.mean=[0.5, 0.25]", "data.std=[1, 2]", "optimizer.lr=0.01",
                        "model.n_layer=6", "train={steps: 50, batch_size: 8}", "data.shuffle=false"});
  EXPECT_DOUBLE_EQ(cfg.optimizer.lr, 0.01);
  EXPECT_EQ(cfg.origins.at("optimizer.lr").str(), "--set optimizer.lr=0.01");
  EXPECT_EQ(cfg.data.mean, (std::vector<double>{0.5, 0.25}));
  EXPECT_EQ(cfg.model.params["n_layer"].as<int>(), 6);
  EXPECT_EQ(cfg.model.origins.at("n_layer").str(), "--set model.n_layer=6");
  EXPECT_EQ(cfg.train.steps, 50);
  EXPECT_EQ(cfg.train.batch_size, 8);
  EXPECT_FALSE(cfg.data.shuffle);
}

TEST(ConfigOverrides, InlineParamsMergeOneByOne) {
  const RunConfig cfg = load_config(kConfigs + "/good/inline.yaml", {"model.params.depth=3"});
  EXPECT_EQ(cfg.model.params["width"].as<int>(), 64);
  EXPECT_EQ(cfg.model.params["depth"].as<int>(), 3);
  EXPECT_EQ(cfg.model.origins.at("params.depth").str(), "--set model.params.depth=3");
}

TEST(ConfigBatch, DerivedValues) {
  RunConfig cfg = load_config_text(kZoo + "train:\n  batch_size: 64\n", "cfg.yaml");
  EXPECT_EQ(cfg.train.micro_batch_size, 64);
  EXPECT_EQ(cfg.train.grad_accumulation, 1);
  EXPECT_EQ(cfg.train.eval_batch_size, 64);
  cfg = load_config_text(kZoo + "train:\n  batch_size: 64\n  micro_batch_size: 16\n", "cfg.yaml");
  EXPECT_EQ(cfg.train.grad_accumulation, 4);
  EXPECT_EQ(cfg.train.eval_batch_size, 64);  // the global batch: the same samples in any layout
  EXPECT_EQ(cfg.resolved["train"]["grad_accumulation"].as<int>(), 4);
  cfg = load_config_text(kZoo + "train:\n  batch_size: 64\n  grad_accumulation: 8\n  eval_batch_size: 100\n",
                         "cfg.yaml");
  EXPECT_EQ(cfg.train.micro_batch_size, 8);
  EXPECT_EQ(cfg.train.eval_batch_size, 100);
  cfg = load_config_text(kZoo + "train:\n  batch_size: 64\n  grad_accumulation: 2\n  micro_batch_size: 32\n",
                         "cfg.yaml");
  EXPECT_EQ(cfg.train.micro_batch_size, 32);
}

TEST(ConfigBatch, InvariantErrorsNameTheBatchSize) {
  EXPECT_EQ(
      error_of(kZoo + "train:\n  batch_size: 64\n  micro_batch_size: 24\n"),
      "cfg.yaml:4:15: train.batch_size: 64 is not divisible into micro-batches of 24 x parallel.data 1");
  EXPECT_EQ(
      error_of(kZoo + "train:\n  batch_size: 64\n  micro_batch_size: 16\n  grad_accumulation: 2\n"),
      "cfg.yaml:4:15: train.batch_size: 64 != micro_batch_size 16 x grad_accumulation 2 x parallel.data 1");
  EXPECT_EQ(error_of(kZoo + "train:\n  batch_size: 10\n  grad_accumulation: 3\n"),
            "cfg.yaml:4:15: train.batch_size: 10 is not divisible into grad_accumulation 3 x parallel.data 1 "
            "micro-batches");
}

TEST(ConfigDerived, PathsFromEnvironmentAndFileName) {
  {
    // Issue 16 row 13: converted data goes to the user's cache, never the source tree.
    ScopedEnv data("FLOWRUN_DATA", nullptr);
    ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
    ScopedEnv home("HOME", "/home/u");
    const RunConfig cfg = load_config_text(kZoo + "data:\n  dataset: kjv\n", "dir/my-run.yaml");
    EXPECT_EQ(cfg.data.path, "/home/u/.cache/flowrun/kjv.h5");
    EXPECT_EQ(cfg.train.run_dir, "runs/my-run");
    ScopedEnv xdg_set("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(load_config_text(kZoo, "c.yaml").data.path, "/xdg/flowrun/fashion_mnist.h5");
    ScopedEnv xdg_relative("XDG_CACHE_HOME", "relative");  // invalid by the XDG rules: ignored
    EXPECT_EQ(load_config_text(kZoo, "c.yaml").data.path, "/home/u/.cache/flowrun/fashion_mnist.h5");
  }
  ScopedEnv data("FLOWRUN_DATA", "/data");
  ScopedEnv models("FLOWRUN_MODELS", "/zoo");
  const RunConfig cfg = load_config_text(kZoo + "train:\n  run_dir: out\n", "cfg.yaml");
  EXPECT_EQ(cfg.data.path, "/data/fashion_mnist.h5");
  EXPECT_EQ(cfg.model.zoo_dir, "/zoo");
  EXPECT_EQ(cfg.train.run_dir, "out");
}

TEST(ConfigResolved, DumpParseDumpIsIdentical) {
  for (const std::string name : {"minimal", "inline"}) {
    const RunConfig cfg = load_config(kConfigs + "/good/" + name + ".yaml",
                                      {"optimizer.eps=1e-7", "train.seed=18446744073709551615"});
    const std::string dumped = dump_config(cfg);
    const RunConfig back = config_from_resolved(dumped, "checkpoint.h5");
    EXPECT_EQ(dump_config(back), dumped) << name;
    EXPECT_DOUBLE_EQ(back.optimizer.eps, 1e-7);
    EXPECT_EQ(back.train.seed, 18446744073709551615u);
    EXPECT_EQ(back.train.run_dir, "runs/" + name);
    EXPECT_EQ(back.data.path, cfg.data.path);
  }
}

TEST(ConfigResolved, EverySectionAndKeyInSchemaOrder) {
  const RunConfig cfg = load_config(kConfigs + "/good/minimal.yaml");
  const std::string dumped = "\n" + dump_config(cfg);
  size_t last = 0;
  for (const auto& section : config::schema()) {
    const size_t at = dumped.find("\n" + section.name + ":\n");
    ASSERT_NE(at, std::string::npos) << section.name;
    EXPECT_GT(at + 1, last) << section.name;
    last = at + 1;
    for (const auto& key : section.keys) {
      if (section.name == "model" && key.name == "layers") continue;  // a zoo model has no inline layers
      EXPECT_TRUE(cfg.resolved[section.name][key.name].IsDefined()) << section.name << "." << key.name;
    }
  }
  EXPECT_TRUE(Contains(dumped, "  lr: 0.05\n"));
  EXPECT_TRUE(Contains(dumped, "  eps: 1e-08\n"));
  EXPECT_TRUE(Contains(dumped, "  beta1: 0.9\n"));
  EXPECT_TRUE(Contains(dumped, "  mean: []\n"));
  EXPECT_TRUE(Contains(dumped, "params:\n    hidden: 32\n"));
}

TEST(ConfigErrors, SyntaxAndFiles) {
  EXPECT_EQ(error_of("model: {zoo: mlp\n"), "cfg.yaml:2:1: YAML syntax error: end of map flow not found");
  EXPECT_EQ(error_of("model:\n\tzoo: mlp\n"),
            "cfg.yaml:2:5: YAML syntax error: illegal map value (tabs are not allowed in YAML indentation)");
  EXPECT_TRUE(Contains(error_of(""), "cfg.yaml: the config is empty"));
  EXPECT_TRUE(Contains(error_of("# nothing but a comment\n"), "cfg.yaml: the config is empty"));
  EXPECT_EQ(
      error_of("- model\n"),
      "cfg.yaml:1:1: expected a map with the sections model, data, train, optimizer, schedule, precision, "
      "parallel, got a list");
  const std::string missing = "/tmp/flowrun-test-config-" + std::to_string(getpid()) + "/none.yaml";
  try {
    load_config(missing);
    ADD_FAILURE() << "missing file accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::bad_input);
    EXPECT_EQ(std::string(e.what()), missing + ": cannot read the config file: No such file or directory");
  }
  EXPECT_THROW(load_config(kConfigs), Error);  // a directory
}

TEST(ConfigErrors, StructureUnknownAndDuplicateKeys) {
  EXPECT_EQ(error_of(kZoo + "optimizer:\n  lrr: 0.1\n"),
            "cfg.yaml:4:3: optimizer.lrr: unknown key 'lrr' (did you mean 'lr'?)");
  EXPECT_EQ(error_of(kZoo + "optimizer:\n  flux: 0.1\n"), "cfg.yaml:4:3: optimizer.flux: unknown key 'flux'");
  EXPECT_EQ(error_of(kZoo + "optimiser:\n  lr: 0.1\n"),
            "cfg.yaml:3:1: optimiser: unknown section 'optimiser' (did you mean 'optimizer'?)");
  EXPECT_EQ(error_of(kZoo + "optimizer:\n  lr: 0.1\n  lr: 0.2\n"),
            "cfg.yaml:5:3: optimizer.lr: duplicate key (first given at line 4)");
  EXPECT_EQ(error_of(kZoo + "train: 5\n"), "cfg.yaml:3:8: train: expected a map of keys, got \"5\"");
  EXPECT_EQ(error_of(kZoo + "train:\n  steps: 10\ntrain:\n  seed: 1\n"),
            "cfg.yaml:5:1: train: duplicate key (first given at line 3)");
}

TEST(ConfigErrors, TypesRangesAndEnums) {
  EXPECT_EQ(error_of(kZoo + "optimizer:\n  lr: fast\n"),
            "cfg.yaml:4:7: optimizer.lr: expected a positive number, got \"fast\"");
  EXPECT_EQ(error_of(kZoo + "optimizer:\n  lr: \"0.1\"\n"),
            "cfg.yaml:4:7: optimizer.lr: expected a positive number, got \"0.1\" (quoted, so a string)");
  EXPECT_EQ(error_of(kZoo + "train:\n  steps: 1.5\n"),
            "cfg.yaml:4:10: train.steps: expected a positive integer, got \"1.5\"");
  EXPECT_EQ(error_of(kZoo + "train:\n  steps: 10k\n"),
            "cfg.yaml:4:10: train.steps: expected a positive integer, got \"10k\"");
  EXPECT_EQ(error_of(kZoo + "data:\n  prefetch: -1\n"),
            "cfg.yaml:4:13: data.prefetch: expected a non-negative integer, got \"-1\"");
  EXPECT_EQ(error_of(kZoo + "train:\n  seed: -1\n"),
            "cfg.yaml:4:9: train.seed: expected a non-negative integer, got \"-1\"");
  EXPECT_EQ(error_of(kZoo + "optimizer:\n  beta1: 1.0\n"),
            "cfg.yaml:4:10: optimizer.beta1: expected a number in [0, 1), got \"1.0\"");
  EXPECT_EQ(error_of(kZoo + "data:\n  shuffle: yes\n"),
            "cfg.yaml:4:12: data.shuffle: expected true or false, got \"yes\"");
  EXPECT_EQ(
      error_of(kZoo + "optimizer:\n  type: adm\n"),
      "cfg.yaml:4:9: optimizer.type: expected one of sgd, adam, adamw, got \"adm\" (did you mean 'adam'?)");
  EXPECT_EQ(error_of(kZoo + "data:\n  mean: [0.5, x]\n"),
            "cfg.yaml:4:15: data.mean[1]: expected a number, got \"x\"");
  EXPECT_EQ(error_of(kZoo + "data:\n  std: [0.5, 0]\n  mean: [0, 0]\n"),
            "cfg.yaml:4:14: data.std[1]: expected a positive number, got \"0\"");
  EXPECT_EQ(error_of(kZoo + "data:\n  mean: 0.5\n"),
            "cfg.yaml:4:9: data.mean: expected a list of numbers, got \"0.5\"");
  EXPECT_EQ(error_of(kZoo + "train:\n  steps:\n"),
            "cfg.yaml:4:3: train.steps: expected a positive integer, got nothing");
  EXPECT_EQ(error_of(kZoo + "precision:\n  loss_scale: big\n"),
            "cfg.yaml:4:15: precision.loss_scale: expected a positive number or dynamic, got \"big\"");
}

TEST(ConfigErrors, ModelSection) {
  EXPECT_EQ(error_of("model:\n  zoo: mlp\n  layers:\n    - relu: {}\n"),
            "cfg.yaml:4:5: model.layers: give either model.zoo or model.layers, not both");
  EXPECT_EQ(error_of("model:\n  init: gpt2\n"),
            "cfg.yaml:2:3: model: expected `zoo: NAME` (a zoo model) or `layers: [...]` (inline layers)");
  EXPECT_EQ(error_of("train:\n  steps: 5\n"),
            "cfg.yaml: model: expected `zoo: NAME` (a zoo model) or `layers: [...]` (inline layers)");
  EXPECT_EQ(
      error_of("model: mlp\n"),
      "cfg.yaml:1:8: model: expected a map of keys, got \"mlp\" (a zoo model is written model: {zoo: NAME})");
  EXPECT_EQ(error_of("model:\n  layer:\n    - relu: {}\n"),
            "cfg.yaml:2:3: model.layer: unknown key 'layer' (did you mean 'layers'?)");
  EXPECT_EQ(error_of("model:\n  layers:\n    - linear: {out: 3, out: 4}\n"),
            "cfg.yaml:3:24: model.layers[0].linear.out: duplicate key (first given at line 3)");
  EXPECT_EQ(error_of("model:\n  layers: []\n"), "cfg.yaml:2:11: model.layers: expected at least one layer");
}

TEST(ConfigErrors, CrossFieldAndOutOfRange) {
  EXPECT_EQ(error_of(kZoo + "schedule:\n  type: step\n"),
            "cfg.yaml:4:9: schedule.type: step needs schedule.step_size > 0 or schedule.milestones");
  EXPECT_EQ(error_of(kZoo + "schedule:\n  milestones: [10, 5]\n"),
            "cfg.yaml:4:15: schedule.milestones: must be strictly increasing, but 5 follows 10");
  EXPECT_EQ(error_of(kZoo + "data:\n  dataset: hdf5\n"),
            "cfg.yaml:4:12: data.dataset: hdf5 needs data.path (an HDF5 file with arrays x and y)");
  EXPECT_EQ(
      error_of(kZoo + "data:\n  mean: [0.5, 0.5]\n  std: [0.2]\n"),
      "cfg.yaml:5:8: data.std: data.mean has 2 values but data.std has 1 (give both, one value per channel)");
  EXPECT_EQ(error_of(kZoo + "optimizer:\n  type: sgd\n  nesterov: true\n"),
            "cfg.yaml:5:13: optimizer.nesterov: Nesterov momentum needs optimizer.momentum > 0 and "
            "optimizer.dampening 0");
  EXPECT_EQ(error_of(kZoo + "parallel:\n  zero: 4\n"),
            "cfg.yaml:4:9: parallel.zero: expected an integer in [0, 3], got \"4\"");
  EXPECT_EQ(error_of(kZoo + "parallel:\n  micro_batches: 2\n"),
            "cfg.yaml:4:18: parallel.micro_batches: 2 micro-batches need parallel.pipeline > 1 (use "
            "train.grad_accumulation)");
  // Invalid values are reported as invalid, not as unsupported.
  EXPECT_EQ(error_of(kZoo + "parallel:\n  data: two\n"),
            "cfg.yaml:4:9: parallel.data: expected a positive integer, got \"two\"");
  EXPECT_EQ(
      error_of(kZoo + "precision:\n  dtype: fp8\n"),
      "cfg.yaml:4:10: precision.dtype: expected one of fp32, fp16, bf16, got \"fp8\" (did you mean 'fp32'?)");
}

TEST(ConfigErrors, SetOverrides) {
  EXPECT_EQ(error_of(kZoo, {"optimizer.lr"}),
            "--set optimizer.lr: expected key.path=value (e.g. optimizer.lr=0.01)");
  EXPECT_EQ(error_of(kZoo, {"=5"}), "--set =5: the key path before '=' is empty");
  EXPECT_EQ(error_of(kZoo, {"optimizer.lr=fast"}),
            "--set optimizer.lr=fast: optimizer.lr: expected a positive number, got \"fast\"");
  EXPECT_EQ(error_of(kZoo, {"optimizer.lrr=1"}),
            "--set optimizer.lrr=1: optimizer.lrr: unknown key 'lrr' (did you mean 'lr'?)");
  EXPECT_EQ(error_of(kZoo, {"optimzer.lr=1"}),
            "--set optimzer.lr=1: optimzer: unknown section 'optimzer' (did you mean 'optimizer'?)");
  EXPECT_EQ(error_of(kZoo, {"optimizer.lr.x=1"}),
            "--set optimizer.lr.x=1: optimizer.lr.x: optimizer.lr has no sub-keys");
  EXPECT_EQ(error_of(kZoo, {"optimizer.lrr.x=1"}),
            "--set optimizer.lrr.x=1: optimizer.lrr: unknown key 'lrr' (did you mean 'lr'?)");
  EXPECT_TRUE(Contains(error_of(kZoo, {"data.mean=[0.5"}),
                       "--set data.mean=[0.5: data.mean: the value is not valid YAML"));
  EXPECT_EQ(error_of(kZoo, {"data.mean=[0.5, a]"}),
            "--set data.mean=[0.5, a]: data.mean[1]: expected a number, got \"a\"");
  // A later override replaces a bad earlier one, which is then never validated.
  EXPECT_NO_THROW(load_config_text(kZoo, "cfg.yaml", {"optimizer.lr=fast", "optimizer.lr=0.1"}));
}

// Loads `file` and, as `flowrun check` does, builds its model: the cases whose error is in a zoo parameter
// or an inline layer only fail there. They use the iris table (4 features, 3 classes), whose shapes are
// given here so that no data file is needed.
void check_file(const fs::path& file, const std::vector<std::string>& sets) {
  const RunConfig cfg = load_config(file.string(), sets);
  ASSERT_EQ(cfg.data.dataset, "iris")
      << file << " loads: its error must be in the model, on data.dataset iris";
  Graph g;
  build_model(g, cfg.model, ModelInputs{false, {cfg.train.micro_batch_size, 4}, 3}, true);
}

// Every file in tests/configs/bad is rejected with exit code 2 and a message containing each of its
// `# expect:` lines; its `# set:` lines are passed as overrides.
TEST(ConfigCorpus, EveryBadConfigIsRejectedWithLocation) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(kConfigs + "/bad"))
    if (entry.path().extension() == ".yaml") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  EXPECT_GE(files.size(), 32u);
  int set_cases = 0;
  for (const auto& file : files) {
    std::ifstream in(file);
    std::vector<std::string> expects, sets;
    for (std::string line; std::getline(in, line) && line.rfind("#", 0) == 0;) {
      if (line.rfind("# expect: ", 0) == 0) expects.push_back(line.substr(10));
      if (line.rfind("# set: ", 0) == 0) sets.push_back(line.substr(7));
    }
    EXPECT_FALSE(expects.empty()) << file << " has no '# expect:' line";
    set_cases += !sets.empty();
    try {
      check_file(file, sets);
      ADD_FAILURE() << file << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::bad_input) << file << ": " << e.what();
      for (const auto& expect : expects) EXPECT_TRUE(Contains(std::string(e.what()), expect)) << file;
    }
  }
  EXPECT_GE(set_cases, 8);
}

TEST(ConfigCorpus, EveryGoodConfigLoads) {
  int n = 0;
  for (const auto& entry : fs::directory_iterator(kConfigs + "/good")) {
    EXPECT_NO_THROW(load_config(entry.path().string())) << entry.path();
    ++n;
  }
  EXPECT_GE(n, 2);
}

}  // namespace
}  // namespace flowrun::testing
