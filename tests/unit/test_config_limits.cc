// Limits on what a config can make flowrun do: file type and size, one YAML document with core tags only,
// alias expansion, integers beyond 64 bits, overflowing sizes and arithmetic in models, unrolling, long
// values cut in messages; and a warmup longer than the run, capped with a note.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "config/config.h"
#include "config_errors.h"
#include "core/error.h"
#include "nn/model.h"

namespace flowrun::testing {
namespace {

const std::string kZoo = "model:\n  zoo: mlp\n";

std::string file_error(const std::string& path) {
  try {
    load_config(path);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::bad_input) << e.what();
    return e.what();
  }
  ADD_FAILURE() << path << " accepted";
  return "";
}

::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << part << "' not in:\n" << text;
}

// The message of building `cfg`'s model (by default on small images (B, 1, 4, 4) with 3 classes), or
// "no error".
std::string model_error(const RunConfig& cfg, const ModelInputs& in = {false, {2, 1, 4, 4}, 3}) {
  Graph g;
  try {
    build_model(g, cfg.model, in, true);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::bad_input) << e.what();
    return e.what();
  }
  return "no error";
}

std::string model_error(const std::string& text, const std::vector<std::string>& sets = {}) {
  return model_error(load_config_text(text, "cfg.yaml", sets));
}

// A billion laughs: `levels` levels of ten aliases of the level below, under `key`.
std::string alias_bomb(const std::string& key, int levels) {
  std::string text = "  l0: &l0 [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]\n";
  for (int i = 1; i < levels; ++i) {
    text += cat("  l", i, ": &l", i, " [");
    for (int j = 0; j < 10; ++j) text += cat(j ? ", " : "", "*l", i - 1);
    text += "]\n";
  }
  return cat(text, "  ", key, ": *l", levels - 1, "\n");
}

class ConfigFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = cat(::testing::TempDir(), "flowrun-config-limits-", getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = cat(dir_, "/", name);
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::string dir_;
};

TEST_F(ConfigFiles, OnlyRegularFilesUpToOneMiB) {
  EXPECT_EQ(
      file_error("/dev/zero"),
      "/dev/zero: cannot read the config file: not a regular file (a device, pipe or socket); give a YAML "
      "file");
  EXPECT_TRUE(Contains(file_error("/dev/urandom"), "not a regular file"));
  const std::string big = write("big.yaml", kZoo + "# " + std::string(kMaxYamlBytes, 'x') + "\n");
  EXPECT_EQ(file_error(big),
            big +
                ": cannot read the config file: larger than 1 MiB (1048576 bytes), the limit "
                "for a config file");
  // Exactly at the limit is read.
  const std::string pad(kMaxYamlBytes - kZoo.size() - 3, 'x');
  EXPECT_NO_THROW(load_config(write("full.yaml", kZoo + "# " + pad + "\n")));
}

TEST_F(ConfigFiles, ZooModelFilesHaveTheSameLimits) {
  write("huge.yaml", "# " + std::string(kMaxYamlBytes, 'x') + "\nlayers: [relu]\n");
  write("two.yaml", "layers: [relu]\n---\nlayers: [tanh]\n");
  for (const std::string name : {"huge", "two"}) {
    const RunConfig cfg =
        load_config_text(cat("model:\n  zoo: ", name, "\n  zoo_dir: ", dir_, "\n"), "cfg.yaml");
    EXPECT_TRUE(Contains(model_error(cfg), cat(dir_, "/", name, ".yaml"))) << name;
  }
  const RunConfig two = load_config_text(cat("model:\n  zoo: two\n  zoo_dir: ", dir_, "\n"), "cfg.yaml");
  EXPECT_TRUE(Contains(model_error(two), "two.yaml:2:1: a second YAML document"));
}

TEST(ConfigLimits, LongValuesAreCutInMessages) {
  const std::string value(1 << 20, 'x');
  const std::string msg = error_of(kZoo + "optimizer:\n  type: " + value + "\n");
  EXPECT_LT(msg.size(), 300u) << msg.substr(0, 300);
  EXPECT_TRUE(Contains(
      msg, "optimizer.type: expected one of sgd, adam, adamw, got \"" + std::string(57, 'x') + "...\""));
  const std::string set = error_of(kZoo, {"optimizer.lr=" + value});
  EXPECT_LT(set.size(), 300u) << set.substr(0, 300);
  EXPECT_TRUE(Contains(set, "--set optimizer.lr=xxx"));
  const std::string key = error_of(kZoo + "optimizer:\n  " + value + ": 1\n");
  EXPECT_LT(key.size(), 300u) << key.substr(0, 300);
  // In the model loader too.
  const std::string model = model_error(kZoo + "  activation: " + value + "\n");
  EXPECT_LT(model.size(), 400u) << model.substr(0, 400);
  EXPECT_TRUE(Contains(model, "got '" + std::string(57, 'x') + "...'"));
  EXPECT_EQ(abbreviate("short"), "short");
  EXPECT_EQ(abbreviate(std::string(61, 'a')), std::string(57, 'a') + "...");
}

TEST(ConfigYaml, OneDocumentAndCoreTagsOnly) {
  EXPECT_EQ(error_of(kZoo + "---\ntrain: {steps: 2}\n"),
            "cfg.yaml:3:1: a second YAML document ('---'): a file holds one document");
  EXPECT_TRUE(Contains(error_of(kZoo + "...\n---\n"), "cfg.yaml:4:1: a second YAML document"));
  EXPECT_EQ(
      error_of("model:\n  zoo: !!python/object:os.system mlp\n"),
      "cfg.yaml:2:8: unknown tag '!!python/object:os.system' (only YAML's core tags are read: !!str, !!int, "
      "!!float, !!bool, !!null, !!seq, !!map)");
  EXPECT_TRUE(Contains(error_of(kZoo + "train: !!python/name:os.system\n"), "cfg.yaml:3:8: unknown tag"));
  EXPECT_TRUE(Contains(error_of(kZoo + "train: !x {steps: 2}\n"), "cfg.yaml:3:8: unknown tag '!x'"));
  EXPECT_TRUE(
      Contains(error_of(kZoo + "train:\n  steps: !!binary 2\n"), "cfg.yaml:4:10: unknown tag '!!binary'"));
  EXPECT_TRUE(
      Contains(error_of(kZoo, {"train.steps=!x 3"}), "--set train.steps=!x 3: train.steps: unknown tag"));
  // A document marker before the one document, and the core tags, are fine; !!str makes a string.
  const RunConfig cfg = load_config_text("---\n" + kZoo + "train: !!map {steps: !!int 5}\n", "cfg.yaml");
  EXPECT_EQ(cfg.train.steps, 5);
  EXPECT_EQ(error_of(kZoo + "train: {steps: !!str 5}\n"),
            "cfg.yaml:3:16: train.steps: expected a positive integer, got \"5\" (tagged !!str, so a string)");
}

TEST(ConfigYaml, AliasExpansionIsBounded) {
  // A few aliases are fine, in the schema's keys and in the model's.
  const RunConfig ok = load_config_text(
      "model:\n  zoo: mlp\n  hidden: &h [8, 8]\ndata:\n  mean: &m [0.5]\n  std: *m\n", "cfg.yaml");
  EXPECT_EQ(ok.data.std, std::vector<double>{0.5});
  EXPECT_EQ(error_of("model:\n  zoo: mlp\n" + alias_bomb("hidden", 9)),
            "cfg.yaml:7:47: the YAML expands to more than 100000 nodes (each alias counts as a copy of its "
            "anchor)");
  // Inline layers and their params, `--set` values.
  EXPECT_TRUE(Contains(error_of("model:\n  layers: [relu]\n  params:\n  " + alias_bomb("x", 9)),
                       "the YAML expands to more than 100000 nodes"));
  EXPECT_TRUE(
      Contains(error_of(kZoo, {"model.hidden=[&a [0,0,0,0,0,0,0,0,0,0], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], "
                               "&c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], "
                               "[*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]]"}),
               "model.hidden: the YAML expands to more than 100000 nodes"));
  // Nesting, which the recursive walkers pay for in stack: 100 levels (98 under `model`) are fine, 101 are
  // not, and neither are 60 levels inside 40 through an alias.
  const auto nested = [](int n) { return std::string(n, '[') + std::string(n, ']'); };
  EXPECT_NO_THROW(load_config_text(kZoo + "  hidden: " + nested(98) + "\n", "cfg.yaml"));
  EXPECT_EQ(
      error_of(kZoo + "  hidden: " + nested(99) + "\n"),
      "cfg.yaml:3:109: the YAML nests deeper than 100 levels (each alias counts as a copy of its anchor)");
  EXPECT_TRUE(Contains(error_of(kZoo + "  a: &a " + nested(60) + "\n  hidden: " + std::string(40, '[') +
                                "*a" + std::string(40, ']') + "\n"),
                       "cfg.yaml:4:51: the YAML nests deeper than 100 levels"));
  EXPECT_EQ(error_of("model:\n  layers: &l [relu, *l]\n"),
            "cfg.yaml:2:21: an alias inside the node it refers to (a cycle)");
}

TEST(ConfigIntegers, OutOfRangeIsAnInputErrorWithTheKey) {
  EXPECT_EQ(error_of(kZoo + "train:\n  steps: 1180591620717411303424\n"),
            "cfg.yaml:4:10: train.steps: expected a positive integer, got \"1180591620717411303424\" (out of "
            "range: -2^63 to 2^63-1)");
  EXPECT_EQ(error_of(kZoo, {"train.seed=18446744073709551616"}),
            "--set train.seed=18446744073709551616: train.seed: expected a non-negative integer, got "
            "\"18446744073709551616\" (out of range: at most 2^64-1)");
  EXPECT_EQ(
      error_of(kZoo + "schedule:\n  milestones: [10, 99999999999999999999]\n"),
      "cfg.yaml:4:20: schedule.milestones[1]: expected a positive integer, got \"99999999999999999999\" (out "
      "of range: -2^63 to 2^63-1)");
  // Not out of range, just invalid.
  EXPECT_EQ(error_of(kZoo + "train:\n  seed: -1\n"),
            "cfg.yaml:4:9: train.seed: expected a non-negative integer, got \"-1\"");
}

TEST(ZooLimits, ParametersOutOfRange) {
  EXPECT_EQ(model_error(kZoo, {"model.hidden=[256,99999999999999999999]"}),
            "--set model.hidden=[256,99999999999999999999]: model.hidden[1]: the integer "
            "99999999999999999999 is out "
            "of range (-2^63 to 2^63-1)");
  EXPECT_EQ(
      model_error(kZoo + "  hidden: [256, -99999999999999999999]\n"),
      "cfg.yaml:3:11: model.hidden[1]: the integer -99999999999999999999 is out of range (-2^63 to 2^63-1)");
  EXPECT_EQ(model_error(kZoo + "  dropout: 1e999\n"),
            "cfg.yaml:3:12: model.dropout: the number 1e999 is out of range");
}

TEST(ZooLimits, GptLayersOutOfRangeOrUnrolledTooFar) {
  const auto gpt = [](const std::string& set) {
    Graph g;
    try {
      build_model(g, load_config_text("model:\n  zoo: gpt\n", "cfg.yaml", {set}).model,
                  ModelInputs{true, {2, 16}, 64}, true);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::bad_input) << e.what();
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(gpt("model.n_layer=1180591620717411303424"),
            "--set model.n_layer=1180591620717411303424: model.n_layer: the integer 1180591620717411303424 "
            "is out of "
            "range (-2^63 to 2^63-1)");
  EXPECT_TRUE(Contains(gpt("model.n_layer=1000000000000"), "the model unrolls to more than 10000 layers"));
  EXPECT_TRUE(Contains(gpt("model.d_model=4611686018427387904"), "is too large"));
}

TEST(ZooLimits, AbsurdSizesAreInputErrorsNotWrapped) {
  // 2^40 x 2^40 weights: 2^80 elements, which int64 arithmetic would wrap.
  EXPECT_TRUE(
      Contains(model_error(kZoo, {"model.hidden=[1099511627776,1099511627776]"}),
               "mlp.yaml:11:11: layers[1].for.layers[0].linear: the parameter 'hidden.1/fc/w' of shape "
               "[1099511627776,1099511627776] is too large (more than 2^48 elements)"));
  // A width of 2^40 on Fashion-MNIST images: 2^40 x 784 weights, in range but beyond any machine.
  EXPECT_TRUE(Contains(model_error(load_config_text(kZoo, "cfg.yaml", {"model.hidden=[1099511627776]"}),
                                   ModelInputs{false, {2, 1, 28, 28}, 10}),
                       "the parameter 'hidden.0/fc/w' of shape [1099511627776,784] is too large"));
  // Each parameter fits, but not their sum: 2^47 + 2^47 elements and the biases.
  EXPECT_TRUE(
      Contains(model_error("model:\n  layers:\n    - flatten\n    - linear: {out: 8796093022208}\n"
                           "    - linear: {out: 16}\n"),
               "model.layers[2].linear: the model has more than 2^48 parameters (at 'linear1/w' of shape "
               "[16,8796093022208])"));
  // A layer's output is checked too: (2, 1, 4, 2^46) from a linear over the last dim of (2, 1, 4, 4).
  EXPECT_TRUE(Contains(model_error("model:\n  layers:\n    - linear: {out: 70368744177664, bias: false}\n"),
                       "the output of shape [2,1,4,70368744177664] is too large"));
}

TEST(ModelLimits, ExpressionsOverflowAndGrowthAreBounded) {
  const auto inline_out = [](const std::string& expr) {
    return model_error(cat(
        "model:\n  params: {w: 4611686018427387904}\n  layers:\n    - flatten\n    - linear:\n        out: ",
        expr, "\n"));
  };
  EXPECT_TRUE(Contains(inline_out("${w * 4}"),
                       "model.layers[1].linear.out: 4611686018427387904 * 4 overflows a "
                       "64-bit integer"));
  EXPECT_TRUE(Contains(inline_out("${w + w}"), "overflows a 64-bit integer"));
  EXPECT_TRUE(Contains(inline_out("${-w - w - w}"), "overflows a 64-bit integer"));
  EXPECT_TRUE(Contains(inline_out("${len([0] * 1000000000000)}"), "the value grows past 1048576"));
  EXPECT_TRUE(Contains(inline_out("${len(range(0, 9223372036854775807))}"), "grows past 1048576 elements"));
  EXPECT_TRUE(Contains(inline_out("${len(range(-9223372036854775807, 9223372036854775807))}"), "grows past"));
  EXPECT_TRUE(Contains(inline_out("${99999999999999999999}"), "bad number"));
  EXPECT_EQ(inline_out("${len(range(3)) * 1}"), "no error");
}

TEST(ConfigWarmup, LongerThanTheRunIsCappedWithANote) {
  const RunConfig cfg =
      load_config_text(kZoo + "train:\n  steps: 1000\nschedule:\n  type: cosine\n  warmup_steps: 2000\n",
                       "cfg.yaml", {"train.steps=10"});
  EXPECT_EQ(cfg.train.steps, 10);
  EXPECT_EQ(cfg.schedule.warmup_steps, 10);
  EXPECT_EQ(cfg.resolved["schedule"]["warmup_steps"].as<int64_t>(), 10);
  ASSERT_EQ(cfg.notes.size(), 1u);
  EXPECT_EQ(cfg.notes[0],
            "cfg.yaml:7:17: schedule.warmup_steps: 2000 is longer than the run: capped to train.steps 10");
  // The resolved config (as a checkpoint stores it) loads again without a note.
  EXPECT_TRUE(config_from_resolved(dump_config(cfg), "checkpoint.h5").notes.empty());
  EXPECT_TRUE(load_config_text(kZoo + "schedule:\n  warmup_steps: 1000\n", "cfg.yaml").notes.empty());
}

}  // namespace
}  // namespace flowrun::testing
