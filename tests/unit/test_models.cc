// Tests of the YAML model loader and the model zoo: parameter counts, one training step of every zoo
// model, overfitting a batch, initialisation schemes, the expression language and error messages.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "nn/expr.h"
#include "nn/model.h"
#include "runtime/executor.h"

namespace flowrun {
namespace {

using nn::MValue;

const std::string kZoo = FLOWRUN_SOURCE_DIR "/models";

ModelConfig zoo(const std::string& name, const std::string& params = "{}") {
  ModelConfig c;
  c.zoo = name;
  c.zoo_dir = kZoo;
  c.params = YAML::Load(params);
  return c;
}

ModelConfig inline_layers(const std::string& layers) {
  ModelConfig c;
  c.layers = YAML::Load(quote_expressions(layers));
  return c;
}

ModelInputs images(int64_t b, int64_t c, int64_t h, int64_t w, int64_t classes) {
  return {false, {b, c, h, w}, classes};
}
ModelInputs text(int64_t b, int64_t t, int64_t vocab) {
  return {true, {b, t}, vocab};
}

// A compiled training program (SGD) with its parameters initialised and a fixed random batch fed.
struct Trainer {
  BuiltModel model;
  std::unique_ptr<Executor> ex;

  Trainer(const ModelConfig& cfg, const ModelInputs& in, uint64_t seed, double lr, double momentum = 0.0) {
    Graph g;
    model = build_model(g, cfg, in, /*training=*/true);
    CompileOptions opts;
    opts.optimizer.type = "sgd";
    opts.optimizer.momentum = momentum;
    ex = std::make_unique<Executor>(compile(std::move(g), opts), kCpu, seed);
    init_parameters(model.init, seed, [&](const std::string& n) -> Tensor& { return ex->tensor(n); });
    ex->tensor("lr").data<float>()[0] = static_cast<float>(lr);
    const RngStream r{seed, 12345};
    Tensor& x = ex->tensor("x");
    Tensor& y = ex->tensor("y");
    const auto classes = static_cast<uint64_t>(in.num_classes);
    for (int64_t i = 0; i < x.numel(); ++i) {
      if (in.text)
        x.data<int64_t>()[i] = static_cast<int64_t>(r.block(static_cast<uint64_t>(i))[0] % classes);
      else
        x.data<float>()[i] = static_cast<float>(r.normal(static_cast<uint64_t>(i)));
    }
    for (int64_t i = 0; i < y.numel(); ++i)
      y.data<int64_t>()[i] =
          static_cast<int64_t>(r.block(static_cast<uint64_t>(i) + (1u << 30))[1] % classes);
  }

  double step() {
    ex->run();
    return ex->output("loss").to_f64()[0];
  }
};

// Trains on the one batch and returns (first loss, last loss).
std::pair<double, double> overfit(Trainer& t, int steps) {
  const double first = t.step();
  double last = first;
  for (int s = 1; s < steps; ++s) {
    last = t.step();
    EXPECT_TRUE(std::isfinite(last)) << "step " << s;
  }
  std::printf("loss on one batch: %.4f -> %.4f after %d SGD steps\n", first, last, steps);
  return {first, last};
}

// ---- the zoo ----

TEST(ZooModels, MlpCountsAndFirstStep) {
  Trainer t(zoo("mlp"), images(8, 1, 28, 28, 10), 1, 0.1);
  EXPECT_EQ(t.model.num_params, 669706);  // 784*512+512 + 512*512+512 + 512*10+10
  const double loss = t.step();
  EXPECT_NEAR(loss, std::log(10.0), 0.3);
  EXPECT_NE(t.model.summary.find("hidden"), std::string::npos) << t.model.summary;
}

TEST(ZooModels, CnnFirstStepAndOverfitsOneBatch) {
  Trainer t(zoo("cnn", "{channels: [8, 16], hidden: [32]}"), images(8, 1, 28, 28, 10), 2, 0.05, 0.9);
  // conv 1->8 (80), conv 8->16 (1168), 16*7*7 -> 32 (25120), 32 -> 10 (330)
  EXPECT_EQ(t.model.num_params, 80 + 1168 + 25120 + 330);
  const auto [first, last] = overfit(t, 30);
  EXPECT_NEAR(first, std::log(10.0), 0.3);
  EXPECT_LT(last, 0.5 * first) << first << " -> " << last;
}

TEST(ZooModels, CnnDefaultsBuild) {
  Graph g;
  const BuiltModel m = build_model(g, zoo("cnn"), images(2, 1, 28, 28, 10), true);
  // conv 1->32 (320), 32->64 (18496), 64*7*7 -> 128 (401536), 128 -> 10 (1290)
  EXPECT_EQ(m.num_params, 320 + 18496 + 401536 + 1290);
}

TEST(ZooModels, Resnet20CountsAndFirstStep) {
  Trainer t(zoo("resnet"), images(2, 3, 32, 32, 10), 3, 0.1);
  // stem 432+32; stage 1: 3 blocks of 2x(2304+32); stage 2: 4608+64, 9216+64, 2 blocks of 2x(9216+64),
  // projection 512+64; stage 3: 18432+128, 36864+128, 2 blocks of 2x(36864+128), projection 2048+128; head
  // 650.
  EXPECT_EQ(t.model.num_params, 272474);
  const Graph& g = t.ex->program().graph;
  EXPECT_NE(g.find_value("stage.1/block.0/shortcut/conv2d0/w"), kNoValue);
  EXPECT_EQ(g.find_value("stage.0/block.0/shortcut/conv2d0/w"), kNoValue);  // identity: same shape
  EXPECT_NE(g.find_value("stage.2/block.2/batchnorm1/running_var"), kNoValue);
  const double loss = t.step();
  std::printf("resnet20 first loss %.4f (log 10 = %.4f)\n", loss, std::log(10.0));
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, std::log(10.0), 0.5);
}

TEST(ZooModels, ResnetBottleneckBuilds) {
  Graph g;
  const BuiltModel m =
      build_model(g, zoo("resnet", "{depth: 29, block: bottleneck}"), images(2, 3, 32, 32, 10), true);
  // Every stage widens (16 -> 64 in stage 1), so each stage's first block has a projection.
  EXPECT_NE(g.find_value("stage.0/block.0/shortcut/conv2d0/w"), kNoValue);
  EXPECT_EQ(g.value(m.logits).shape(), (Shape{2, 10}));
  EXPECT_EQ(g.value(g.find_value("head/w")).shape(), (Shape{10, 256}));
}

TEST(ZooModels, Gpt2SmallHas124MParameters) {
  Graph g;
  const BuiltModel m =
      build_model(g, zoo("gpt", "{n_layer: 12, n_head: 12, d_model: 768}"), text(1, 1024, 50257), true);
  EXPECT_EQ(m.num_params, 124439808);  // the tied head adds no parameter
  EXPECT_EQ(g.value(m.logits).shape(), (Shape{1, 1024, 50257}));
  EXPECT_NE(g.find_value("blocks.11/attn/qkv/w"), kNoValue);
}

// GPT-2's vocabulary over byte data (configs/bench/gpt2_124m.yaml): the head predicts 50257 classes, the
// targets use 256 of them. A vocabulary smaller than the data's is refused.
TEST(ZooModels, GptVocabularyLargerThanTheData) {
  Graph g;
  const BuiltModel m = build_model(g, zoo("gpt", "{n_layer: 1, vocab_size: 50257}"), text(2, 16, 256), true);
  EXPECT_EQ(g.value(m.logits).shape(), (Shape{2, 16, 50257}));
  Graph small;
  EXPECT_THROW(build_model(small, zoo("gpt", "{n_layer: 1, vocab_size: 100}"), text(2, 16, 256), true), Error);
}

TEST(ZooModels, GptDefaultFirstStep) {
  Trainer t(zoo("gpt"), text(2, 16, 64), 4, 0.1);
  const double loss = t.step();
  EXPECT_NEAR(loss, std::log(64.0), 0.1);  // gpt2 init: logits near zero
  EXPECT_NE(t.model.summary.find("blocks"), std::string::npos);
  std::printf("%s", t.model.summary.c_str());
}

TEST(ZooModels, TinyGptOverfitsOneBatch) {
  Trainer t(zoo("gpt", "{n_layer: 2, d_model: 32, n_head: 4}"), text(4, 16, 32), 5, 0.5, 0.9);
  const auto [first, last] = overfit(t, 30);
  EXPECT_NEAR(first, std::log(32.0), 0.1);
  EXPECT_LT(last, 0.5 * first) << first << " -> " << last;
}

// ---- the modern zoo: Llama, ViT, BERT ----

int count_ops(const Graph& g, const std::string& op) {
  int n = 0;
  for (const Node& node : g.nodes()) n += node.op == op;
  return n;
}

// The published counts, from shapes only (nothing is allocated): Llama-2-7B (multi-head, untied head) and
// Mistral-7B (8 key/value heads for 32 query heads, SwiGLU 14336).
TEST(ZooModels, Llama7BShapesHaveThePublishedCounts) {
  {
    Graph g;
    const BuiltModel m =
        build_model(g, zoo("llama", "{n_layer: 32, d_model: 4096, n_head: 32, n_kv_head: 32, ffn: 11008}"),
                    text(1, 16, 32000), true);
    EXPECT_EQ(m.num_params, 6738415616);
    EXPECT_EQ(g.value(g.find_value("layers.31/attn/k/w")).shape(), (Shape{4096, 4096}));
    EXPECT_EQ(count_ops(g, "broadcast_to"), 0);  // no group to broadcast over
  }
  {
    Graph g;
    const BuiltModel m =
        build_model(g, zoo("llama", "{n_layer: 32, d_model: 4096, n_head: 32, n_kv_head: 8, ffn: 14336}"),
                    text(1, 16, 32000), true);
    EXPECT_EQ(m.num_params, 7241732096);
    EXPECT_EQ(g.value(g.find_value("layers.0/attn/k/w")).shape(), (Shape{1024, 4096}));
    EXPECT_EQ(g.value(g.find_value("layers.0/mlp/gate/w")).shape(), (Shape{14336, 4096}));
    EXPECT_EQ(g.value(g.find_value("lm_head/w")).shape(), (Shape{32000, 4096}));
    EXPECT_EQ(count_ops(g, "broadcast_to"), 64);  // k and v of each block
    EXPECT_EQ(count_ops(g, "rope"), 64);          // q and k of each block
  }
}

TEST(ZooModels, LlamaNamesNoBiasesTiedHeadAndFirstStep) {
  Trainer t(zoo("llama", "{n_layer: 2, n_head: 4, n_kv_head: 2, d_model: 32, ffn: 64}"), text(2, 16, 64), 6,
            0.1);
  const Graph& g = t.ex->program().graph;
  for (const std::string n :
       {"embed_tokens/w", "layers.1/ln1/gamma", "layers.1/attn/q/w", "layers.1/attn/k/w", "layers.1/attn/v/w",
        "layers.1/attn/proj/w", "layers.1/ln2/gamma", "layers.1/mlp/gate/w", "layers.1/mlp/up/w",
        "layers.1/mlp/down/w", "norm/gamma", "lm_head/w"})
    EXPECT_NE(g.find_value(n), kNoValue) << n;
  for (const std::string n : {"layers.0/attn/q/b", "layers.0/mlp/down/b", "layers.0/ln1/beta", "lm_head/b"})
    EXPECT_EQ(g.find_value(n), kNoValue) << n;
  // embed 64*32, per block q 32*32, k and v 16*32, proj 32*32, gate and up 64*32, down 32*64, norms 2*32;
  // final norm 32, head 64*32.
  const int64_t block = 1024 + 512 + 512 + 1024 + 3 * 2048 + 64;
  EXPECT_EQ(t.model.num_params, 2048 + 2 * block + 32 + 2048);
  EXPECT_EQ(t.model.init.at("layers.0/mlp/down/w").b, 0.02 / std::sqrt(2.0 * 2));  // a residual projection
  const double loss = t.step();
  EXPECT_NEAR(loss, std::log(64.0), 0.1);
  Graph tied;
  const BuiltModel m =
      build_model(tied, zoo("llama", "{n_layer: 1, d_model: 32, tie_head: true}"), text(2, 8, 64), true);
  EXPECT_EQ(tied.find_value("lm_head/w"), kNoValue);
  EXPECT_EQ(tied.value(m.logits).shape(), (Shape{2, 8, 64}));
}

TEST(ZooModels, TinyLlamaOverfitsOneBatch) {
  Trainer t(zoo("llama", "{n_layer: 2, d_model: 32, n_head: 4, n_kv_head: 2, ffn: 64}"), text(4, 16, 32), 5,
            0.1, 0.9);
  const auto [first, last] = overfit(t, 60);
  EXPECT_NEAR(first, std::log(32.0), 0.1);
  EXPECT_LT(last, 0.5 * first) << first << " -> " << last;
}

// Grouped-query attention is multi-head attention whose key/value heads repeat within each group: a GQA
// layer (4 heads, 2 kv heads) gives the loss of an MHA layer whose k and v weights repeat the GQA ones' head
// rows (query head h reads kv head h / 2), and its k/v gradients are the sums of the MHA ones over groups.
TEST(ModelLayers, GroupedQueryAttentionIsMultiHeadWithRepeatedHeads) {
  auto build = [](int64_t kv) {
    ModelConfig c =
        inline_layers(cat("[{embedding: {name: e, vocab: 16, dim: 16}}, {attention: {name: a, heads: 4, "
                          "kv_heads: ",
                          kv, ", qkv: separate}}, {tied_head: {to: e}}]"));
    return Trainer(c, text(2, 6, 16), 3, 1.0);  // SGD with lr 1: a weight's change is minus its gradient
  };
  Trainer gqa = build(2), mha = build(4);
  for (const std::string n : {"e/w", "a/q/w", "a/q/b", "a/proj/w", "a/proj/b"})
    mha.ex->tensor(n).fill_from(gqa.ex->tensor(n).to_f64());
  for (const std::string n : {"a/k", "a/v"}) {
    const Tensor& w = gqa.ex->tensor(n + "/w");  // (2 heads * 4, 16)
    const Tensor& b = gqa.ex->tensor(n + "/b");
    const std::vector<double> wv = w.to_f64(), bv = b.to_f64();
    std::vector<double> w4, b4;
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t d = 0; d < 4; ++d) {
        const int64_t row = (h / 2) * 4 + d;
        w4.insert(w4.end(), wv.begin() + row * 16, wv.begin() + (row + 1) * 16);
        b4.push_back(bv[static_cast<size_t>(row)]);
      }
    mha.ex->tensor(n + "/w").fill_from(w4);
    mha.ex->tensor(n + "/b").fill_from(b4);
  }
  mha.ex->tensor("x").fill_from(gqa.ex->tensor("x").to_f64());
  mha.ex->tensor("y").fill_from(gqa.ex->tensor("y").to_f64());
  const std::vector<double> k2 = gqa.ex->tensor("a/k/w").to_f64(), k4 = mha.ex->tensor("a/k/w").to_f64();
  const double a = gqa.step(), b = mha.step();
  EXPECT_NEAR(a, b, 1e-5 * std::abs(b));
  const std::vector<double> n2 = gqa.ex->tensor("a/k/w").to_f64(), n4 = mha.ex->tensor("a/k/w").to_f64();
  double scale = 0;
  for (size_t i = 0; i < n4.size(); ++i) scale = std::max(scale, std::abs(n4[i] - k4[i]));
  EXPECT_GT(scale, 0.0);
  for (int64_t row = 0; row < 8; ++row)
    for (int64_t i = 0; i < 16; ++i) {
      const int64_t h = row / 4, d = row % 4;
      const size_t r0 = static_cast<size_t>(((2 * h) * 4 + d) * 16 + i),
                   r1 = static_cast<size_t>(((2 * h + 1) * 4 + d) * 16 + i);
      const size_t j = static_cast<size_t>(row * 16 + i);
      EXPECT_NEAR(n2[j] - k2[j], (n4[r0] - k4[r0]) + (n4[r1] - k4[r1]), 1e-5 * scale) << row << "," << i;
    }
}

// pad_id: keys whose input id is the pad are invisible, so the unpadded positions of a bidirectional layer
// give what the sequence without its padding gives.
TEST(ModelLayers, AttentionPadIdHidesPaddedKeys) {
  const std::string layers =
      "[{embedding: {name: e, vocab: 16, dim: 16}}, {attention: {name: a, heads: 2, causal: false, pad_id: 0}}, "
      "{tied_head: {to: e}}]";
  Trainer padded(inline_layers(layers), text(1, 8, 16), 3, 0.0), plain(inline_layers(layers), text(1, 5, 16), 3, 0.0);
  const std::vector<double> ids = {3, 7, 1, 9, 4, 0, 0, 0};
  padded.ex->tensor("x").fill_from(ids);
  plain.ex->tensor("x").fill_from(std::vector<double>(ids.begin(), ids.begin() + 5));
  padded.step();
  plain.step();
  const std::vector<double> a = padded.ex->output("logits").to_f64(), b = plain.ex->output("logits").to_f64();
  ASSERT_EQ(a.size(), 8u * 16u);
  for (size_t i = 0; i < b.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << i;
  bool differs = false;  // without the mask the padded keys change the outputs
  Trainer unmasked(inline_layers("[{embedding: {name: e, vocab: 16, dim: 16}}, {attention: {name: a, heads: 2, causal: "
                                 "false}}, {tied_head: {to: e}}]"),
                   text(1, 8, 16), 3, 0.0);
  unmasked.ex->tensor("x").fill_from(ids);
  unmasked.step();
  const std::vector<double> c = unmasked.ex->output("logits").to_f64();
  for (size_t i = 0; i < b.size(); ++i) differs = differs || std::abs(c[i] - b[i]) > 1e-4;
  EXPECT_TRUE(differs);
  Graph g;
  EXPECT_THROW(build_model(g, inline_layers("[flatten, {linear: {out: 8}}, {reshape: {shape: [2, 4]}}, {attention: "
                                            "{heads: 2, pad_id: 0}}, flatten, {linear: {out: 3}}]"),
                           images(2, 1, 2, 2, 3), true),
               Error);
}

TEST(ZooModels, VitCountsAndOverfitsOneBatch) {
  Graph g;
  const BuiltModel m =
      build_model(g, zoo("vit", "{patch: 7, d_model: 128, ffn: 512}"), images(2, 1, 28, 28, 10), true);
  // patches 128*49 + 128, class token 128, positions 17*128; per block norms 4*128, qkv 128*384 + 384,
  // proj 128*128 + 128, fc 128*512 + 512, proj 512*128 + 128; final norm 256, head 1290.
  EXPECT_EQ(m.num_params, 6400 + 128 + 2176 + 4 * 198272 + 256 + 1290);
  EXPECT_EQ(g.value(g.find_value("pos_embed/w")).shape(), (Shape{17, 128}));
  for (const Node& n : g.nodes())
    if (n.op == "sdpa") {
      EXPECT_FALSE(n.attrs.b("causal"));
    }
  Trainer t(zoo("vit", "{patch: 4, n_layer: 2, d_model: 32, ffn: 64}"), images(8, 1, 28, 28, 10), 2, 0.1,
            0.9);
  EXPECT_EQ(t.ex->program().graph.value(t.ex->program().graph.find_value("pos_embed/w")).shape(),
            (Shape{50, 32}));
  const auto [first, last] = overfit(t, 60);
  EXPECT_NEAR(first, std::log(10.0), 0.3);
  EXPECT_LT(last, 0.5 * first) << first << " -> " << last;
  ModelConfig bad = zoo("vit", "{patch: 5}");
  bad.origins["patch"] = Origin{"run.yaml", 3, 10, ""};
  try {
    Graph b;
    build_model(b, bad, images(2, 1, 28, 28, 10), true);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "run.yaml:3:10: model.patch: must divide the image sides 28x28, got 5");
  }
}

// BERT-base's shapes give BertForMaskedLM's count: BertModel's 109,482,240 without the pooler (590,592),
// plus the MLM head's transform (590,592 + 1,536) and decoder bias (30,522).
TEST(ZooModels, BertBaseShapesHaveTheMaskedLmCount) {
  Graph g;
  const BuiltModel m = build_model(g,
                                   zoo("bert",
                                       "{n_layer: 12, n_head: 12, d_model: 768, ffn: 3072, max_len: 512, "
                                       "vocab_size: 30522, mask_id: 103}"),
                                   text(1, 16, 30522), true);
  EXPECT_EQ(m.num_params, 109482240 - 590592 + 590592 + 1536 + 30522);
  EXPECT_NE(g.find_value("layer.11/attn/q/w"), kNoValue);
  EXPECT_EQ(g.value(g.find_value("decoder/b")).shape(), (Shape{30522}));
  EXPECT_EQ(g.value(g.find_value("token_type_embeddings/w")).shape(), (Shape{2, 768}));
}

// The mlm_mask layer's labels are the loss's targets (the data's y is not read), in training and in eval
// programs, where the draw is fixed.
TEST(ZooModels, BertMlmLabelsReplaceTheTargets) {
  for (bool training : {true, false}) {
    Graph g;
    const BuiltModel m = build_model(g, zoo("bert", "{n_layer: 1, d_model: 32, n_head: 2, ffn: 64}"),
                                     text(2, 16, 64), training);
    const Node& loss = g.node(g.value(m.loss).producer);
    const Node& mask = g.node(g.value(loss.inputs[1]).producer);
    EXPECT_EQ(mask.op, "mlm_mask");
    EXPECT_EQ(mask.inputs[0], m.x);
    EXPECT_EQ(loss.inputs[1], mask.outputs[1]);
    // Its count of masked positions is the loss's denominator.
    ASSERT_EQ(loss.inputs.size(), 3u);
    EXPECT_EQ(loss.inputs[2], mask.outputs[2]);
    // The masked ids come from the first node, the labels from its twin next to the loss: the same name
    // (the same random stream), attributes and ids.
    int masks = 0;
    for (const Node& n : g.nodes())
      if (n.op == "mlm_mask") {
        ++masks;
        EXPECT_EQ(n.name, mask.name);
        EXPECT_EQ(n.attrs.str(), mask.attrs.str());
        EXPECT_EQ(n.inputs, mask.inputs);
      }
    EXPECT_EQ(masks, 2);
    EXPECT_EQ(mask.attrs.i("vocab"), 64);
    EXPECT_EQ(mask.attrs.i("mask_id"), 64);
    EXPECT_EQ(mask.attrs.b("fixed"), !training);
    EXPECT_EQ(g.value(m.logits).shape(), (Shape{2, 16, 72}));  // the data's 64 ids, [MASK], padded to 8k
    for (const Node& n : g.nodes()) EXPECT_NE(n.op == "sdpa" && n.attrs.b("causal"), true);
  }
  Trainer t(zoo("bert", "{n_layer: 2, d_model: 32, n_head: 2, ffn: 64, mask_p: 0.5}"), text(4, 16, 32), 5,
            0.1, 0.9);
  const auto [first, last] = overfit(t, 60);  // the executor's step stays 0: the same positions every step
  EXPECT_NEAR(first, std::log(40.0), 0.3);
  EXPECT_LT(last, 0.6 * first) << first << " -> " << last;
}

TEST(ZooModels, ListsEveryModelWithItsDoc) {
  const auto models = list_zoo(kZoo);
  std::vector<std::string> names;
  for (const auto& [name, doc] : models) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"bert", "cnn", "gpt", "llama", "mlp", "resnet", "vit"}));
  for (const auto& [name, doc] : models) EXPECT_FALSE(doc.empty()) << name;
}

TEST(ZooModels, ZooDirectoryFromConfigThenEnvironment) {
  ModelConfig c;
  c.zoo_dir = "/somewhere";
  EXPECT_EQ(zoo_directory(c), "/somewhere");
  c.zoo_dir = "";
  setenv("FLOWRUN_MODELS", "/from/env", 1);
  EXPECT_EQ(zoo_directory(c), "/from/env");
  unsetenv("FLOWRUN_MODELS");
  EXPECT_EQ(zoo_directory(c), FLOWRUN_MODELS_DIR);
}

// ---- initialisation ----

// Allocates a tensor per init entry (shapes from the graph) and fills them.
std::map<std::string, Tensor> initialised(const Graph& g, const BuiltModel& m, uint64_t seed) {
  std::map<std::string, Tensor> t;
  for (const auto& [name, s] : m.init)
    t[name] = Tensor::empty(g.value(g.find_value(name)).shape(), DType::f32);
  init_parameters(m.init, seed, [&](const std::string& n) -> Tensor& { return t.at(n); });
  return t;
}

std::pair<double, double> mean_std(const Tensor& t) {
  const std::vector<double> v = t.to_f64();
  double s = 0, s2 = 0;
  for (double x : v) s += x, s2 += x * x;
  const double n = static_cast<double>(v.size()), mean = s / n;
  return {mean, std::sqrt(s2 / n - mean * mean)};
}

TEST(ModelInit, Gpt2StdAndResidualProjections) {
  Graph g;
  const BuiltModel m = build_model(g, zoo("gpt", "{n_layer: 4, d_model: 128}"), text(1, 32, 256), true);
  const auto t = initialised(g, m, 11);
  EXPECT_NEAR(mean_std(t.at("blocks.0/attn/qkv/w")).second, 0.02, 0.001);
  EXPECT_NEAR(mean_std(t.at("blocks.2/mlp/fc/w")).second, 0.02, 0.001);
  EXPECT_NEAR(mean_std(t.at("wte/w")).second, 0.02, 0.001);
  EXPECT_NEAR(mean_std(t.at("wpe/w")).second, 0.02, 0.002);
  const double resid = 0.02 / std::sqrt(2.0 * 4);
  EXPECT_NEAR(mean_std(t.at("blocks.1/attn/proj/w")).second, resid, 0.0005);
  EXPECT_NEAR(mean_std(t.at("blocks.3/mlp/proj/w")).second, resid, 0.0005);
  EXPECT_EQ(mean_std(t.at("blocks.0/attn/qkv/b")), (std::pair<double, double>{0.0, 0.0}));
  EXPECT_EQ(mean_std(t.at("ln_f/gamma")), (std::pair<double, double>{1.0, 0.0}));
}

TEST(ModelInit, PytorchAndKaimingSchemes) {
  Graph g;
  const BuiltModel m = build_model(g, zoo("resnet"), images(2, 3, 32, 32, 10), true);
  const auto t = initialised(g, m, 3);
  // kaiming: conv N(0, sqrt(2 / fan_out)), fan_out = 32 * 3 * 3; BN running_var 1; head U(+-1/sqrt(64)).
  EXPECT_NEAR(mean_std(t.at("stage.1/block.1/conv2d0/w")).second, std::sqrt(2.0 / 288), 0.003);
  EXPECT_EQ(mean_std(t.at("stage.1/block.1/batchnorm0/running_var")).first, 1.0);
  const auto head = t.at("head/w").to_f64();
  const double hi = *std::max_element(head.begin(), head.end()),
               lo = *std::min_element(head.begin(), head.end());
  EXPECT_LE(hi, 0.125);
  EXPECT_GE(lo, -0.125);
  EXPECT_GT(hi - lo, 0.2);
}

TEST(ModelInit, OverrideOption) {
  Graph g;
  const BuiltModel m = build_model(g,
                                   inline_layers("[flatten, {linear: {name: a, out: 64, init: {kind: normal, "
                                                 "std: 0.5}}}, {linear: {out: ${num_classes}}}]"),
                                   images(2, 1, 16, 16, 10), true);
  EXPECT_EQ(m.init.at("a/w").kind, "normal");
  EXPECT_EQ(m.init.at("a/w").b, 0.5);
  EXPECT_NEAR(mean_std(initialised(g, m, 1).at("a/w")).second, 0.5, 0.02);
}

TEST(ModelInit, IndependentOfBuildOrderAndSeeded) {
  auto values = [](const std::string& layers, uint64_t seed) {
    Graph g;
    const BuiltModel m = build_model(g, inline_layers(layers), images(2, 1, 4, 4, 8), true);
    return initialised(g, m, seed).at("q/w").to_f64();
  };
  const auto second = values("[flatten, {linear: {name: p, out: 8}}, {linear: {name: q, out: 8}}]", 7);
  const auto third = values(
      "[flatten, {linear: {name: r, out: 8}}, {linear: {name: s, out: 8}}, {linear: {name: q, out: 8}}]", 7);
  EXPECT_EQ(second, third);
  EXPECT_EQ(second, values("[flatten, {linear: {name: p, out: 8}}, {linear: {name: q, out: 8}}]", 7));
  EXPECT_NE(second, values("[flatten, {linear: {name: p, out: 8}}, {linear: {name: q, out: 8}}]", 8));
}

// ---- layers ----

TEST(ModelLayers, EvalProgramsHaveNoDropoutAndRunningStatistics) {
  for (bool training : {true, false}) {
    Graph g;
    build_model(g,
                inline_layers("[{conv2d: {out: 4, kernel: 3}}, batchnorm, {dropout: {p: 0.5}}, flatten, "
                              "{linear: {out: ${num_classes}}}]"),
                images(2, 1, 8, 8, 3), training);
    int dropouts = 0;
    for (const Node& n : g.nodes()) {
      dropouts += n.op == "dropout";
      if (n.op == "batchnorm") {
        EXPECT_EQ(n.attrs.b("training"), training);
      }
    }
    EXPECT_EQ(dropouts, training ? 1 : 0);
  }
}

TEST(ModelLayers, SkipConnectionsAndResidualShortcuts) {
  Graph g;
  const BuiltModel m = build_model(g, inline_layers(R"([
      {conv2d: {out: 4, kernel: 3, padding: 1}},
      {save: {name: skip}},
      {conv2d: {out: 4, kernel: 3, padding: 1}},
      {add: {from: skip}},
      {concat: {from: skip, axis: 1}},
      {residual: {layers: [{conv2d: {out: 8, kernel: 1}}], activation: relu}},
      global_avgpool,
      {linear: {out: 5}}])"),
                                   images(2, 3, 6, 6, 5), true);
  EXPECT_EQ(g.value(m.logits).shape(), (Shape{2, 5}));
  EXPECT_NE(g.find_value("residual0/conv2d0/w"), kNoValue);
}

TEST(ModelLayers, ForIfAndRepeatScopes) {
  Graph g;
  ModelConfig c = inline_layers(R"([
      flatten,
      {for: {name: fc, each: ${widths}, as: w, layers: [{linear: {out: ${w}}}, {if: {cond: ${i == 0}, then: [relu], else: [tanh]}}]}},
      {repeat: {times: 2, layers: [{linear: {out: 6}}]}},
      {linear: {out: ${num_classes}}}])");
  c.params = YAML::Load("{widths: [12, 10]}");
  const BuiltModel m = build_model(g, c, images(2, 1, 2, 2, 3), true);
  EXPECT_NE(g.find_value("fc.1/linear0/w"), kNoValue);
  EXPECT_NE(g.find_value("repeat0.1/w"), kNoValue);  // the only layer of a repeat body takes its scope
  int relu = 0, tanh = 0;
  for (const Node& n : g.nodes()) relu += n.op == "relu", tanh += n.op == "tanh";
  EXPECT_EQ(relu, 1);
  EXPECT_EQ(tanh, 1);
  EXPECT_EQ(m.num_params, (4 * 12 + 12) + (12 * 10 + 10) + (10 * 6 + 6) + (6 * 6 + 6) + (6 * 3 + 3));
}

TEST(ModelLayers, ReshapeTransposeSelectMulAndPatches) {
  Graph g;
  const BuiltModel m = build_model(g, inline_layers(R"([
      {patch_embed: {name: p, patch: [2, 4], dim: 6}},
      {class_token: {name: cls, dim: 6}},
      {save: {name: s}},
      {mul: {from: s}},
      {transpose: {dims: [1, -1]}},
      {reshape: {shape: [3, -1]}},
      {transpose: {dims: [2, 1]}},
      {select: {axis: -1, index: -1}},
      {linear: {out: 5}}])"),
                                   images(2, 3, 8, 8, 5), true);
  // 4x2 patches of 2x4: (2, 8, 6); the class token: (2, 9, 6); (2, 6, 9) -> (2, 3, 18) -> (2, 18, 3) ->
  // (2, 18).
  EXPECT_EQ(g.value(g.find_value("p/w")).shape(), (Shape{6, 3, 2, 4}));
  EXPECT_EQ(g.value(g.find_value("cls/w")).shape(), (Shape{1, 1, 6}));
  EXPECT_EQ(g.value(m.logits).shape(), (Shape{2, 5}));
  EXPECT_EQ(m.num_params, 6 * 3 * 8 + 6 + 6 + 18 * 5 + 5);
}

// A gated MLP written inline: silu(gate(x)) * up(x), then down, the up branch built on the saved input.
TEST(ModelLayers, InlineSwiGluMultipliesTwoBranches) {
  Graph g;
  const BuiltModel m = build_model(g, inline_layers(R"([
      flatten,
      {save: {name: x0}},
      {linear: {name: gate, out: 12, bias: false}},
      silu,
      {mul: {name: gated, from: x0, layers: [{linear: {name: up, out: 12, bias: false}}]}},
      {linear: {name: down, out: ${num_classes}, bias: false}}])"),
                                   images(2, 1, 2, 4, 3), true);
  EXPECT_EQ(g.value(g.find_value("gated/up/w")).shape(), (Shape{12, 8}));
  EXPECT_EQ(m.num_params, 8 * 12 + 8 * 12 + 12 * 3);
  const Node& mul = g.node(g.value(g.node(g.value(m.logits).producer).inputs[0]).producer);
  EXPECT_EQ(mul.op, "mul");
  EXPECT_EQ(g.node(g.value(mul.inputs[0]).producer).op, "silu");
  EXPECT_EQ(g.node(g.value(mul.inputs[1]).producer).op, "linear");
}

// BERT's post-LN block and the options of a Llama block, by their parameters and ops.
TEST(ModelLayers, TransformerBlockOptions) {
  auto built = [](const std::string& block, std::map<std::string, int>* ops) {
    Graph g;
    build_model(
        g,
        inline_layers(cat("[{embedding: {name: e, vocab: 16, dim: 16}}, {transformer_block: {name: t, ",
                          block, "}}, {tied_head: {to: e}}]")),
        text(2, 8, 16), true);
    for (const Node& n : g.nodes()) ++(*ops)[n.op];
    std::vector<std::string> names;
    for (const Value& v : g.values())
      if (v.kind == ValueKind::param) names.push_back(v.name);
    return names;
  };
  std::map<std::string, int> ops;
  EXPECT_EQ(built("heads: 2", &ops),
            (std::vector<std::string>{"e/w", "t/ln1/gamma", "t/ln1/beta", "t/attn/qkv/w", "t/attn/qkv/b",
                                      "t/attn/proj/w", "t/attn/proj/b", "t/ln2/gamma", "t/ln2/beta",
                                      "t/mlp/fc/w", "t/mlp/fc/b", "t/mlp/proj/w", "t/mlp/proj/b"}));
  ops.clear();
  EXPECT_EQ(built("heads: 4, kv_heads: 2, norm: rmsnorm, mlp: swiglu, ffn: 24, bias: false, rope: true, qkv: "
                  "separate",
                  &ops),
            (std::vector<std::string>{"e/w", "t/ln1/gamma", "t/attn/q/w", "t/attn/k/w", "t/attn/v/w",
                                      "t/attn/proj/w", "t/ln2/gamma", "t/mlp/gate/w", "t/mlp/up/w",
                                      "t/mlp/down/w"}));
  EXPECT_EQ(ops["rmsnorm"], 2);
  EXPECT_EQ(ops["rope"], 2);
  EXPECT_EQ(ops["silu"], 1);
  EXPECT_EQ(ops["mul"], 1);
  EXPECT_EQ(ops["broadcast_to"], 2);
  ops.clear();
  built("heads: 2, post_norm: true, causal: false, mlp: gelu, norm_eps: 1e-12", &ops);
  EXPECT_EQ(ops["layernorm"], 2);
  EXPECT_EQ(ops["gelu"], 1);
}

// ---- expressions ----

MValue eval(const std::string& e) {
  nn::Env env;
  env.set("hidden", MValue(MValue::List{MValue(int64_t{256}), MValue(int64_t{128})}));
  env.set("depth", MValue(int64_t{20}));
  env.set("block", MValue(std::string("basic")));
  return nn::eval_expr(e, env);
}

TEST(ModelExpr, ArithmeticListsAndConditions) {
  EXPECT_EQ(eval("(depth - 2) // 6"), MValue(int64_t{3}));
  EXPECT_EQ(eval("-7 // 2"), MValue(int64_t{-4}));
  EXPECT_EQ(eval("7 % -3"), MValue(int64_t{-2}));
  EXPECT_EQ(eval("7 / 2"), MValue(3.5));
  EXPECT_EQ(eval("2 * -3 + 1"), MValue(int64_t{-5}));
  EXPECT_EQ(eval("len(hidden) + hidden[-1]"), MValue(int64_t{130}));
  EXPECT_EQ(eval("[1, 2] * 2"), eval("[1, 2, 1, 2]"));
  EXPECT_EQ(eval("6 if block == 'basic' else 9"), MValue(int64_t{6}));
  EXPECT_EQ(eval("depth > 2 and not (depth % 6 == 2) or false"), MValue(false));
  EXPECT_EQ(eval("range(3)"), eval("[0, 1, 2]"));
  EXPECT_EQ(eval("max(hidden)"), MValue(int64_t{256}));
  EXPECT_EQ(eval("1e-3 * 2"), MValue(0.002));
}

TEST(ModelExpr, Errors) {
  auto error = [](const std::string& e) {
    try {
      eval(e);
    } catch (const nn::ExprError& err) {
      return std::string(err.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error("dept"), "unknown name 'dept' (did you mean 'depth'?)");
  EXPECT_EQ(error("hidden[2]"), "index 2 out of range for a list of 2");
  EXPECT_EQ(error("1 +"), "unexpected 'end of expression'");
  EXPECT_EQ(error("depth // 0"), "division by zero");
  EXPECT_EQ(error("block - 1"), "cannot apply '-' to 'basic' (string) and 1 (integer)");
  EXPECT_EQ(error("(1"), "expected ')', got 'end of expression'");
  EXPECT_EQ(error("depth if 1 else 2"), "'if' needs a boolean, got 1 (integer)");
}

TEST(ModelExpr, QuotesWholeScalarExpressionsOnly) {
  std::map<int, std::vector<int>> ins;
  EXPECT_EQ(quote_expressions("a: {x: ${n * 2}, s: '${k}', t: p${i}}\n- ${[1, 2]}  # ${c}", &ins),
            "a: {x: \"${n * 2}\", s: '${k}', t: p${i}}\n- \"${[1, 2]}\"  # ${c}");
  EXPECT_EQ(ins[0], (std::vector<int>{7, 16}));
  EXPECT_EQ(ins[1], (std::vector<int>{2, 12}));
  EXPECT_EQ(quote_expressions("c: ${b == 'x'}"), "c: \"${b == 'x'}\"");
}

// ---- errors ----

class ModelErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = cat(::testing::TempDir(), "/flowrun-test-models-", getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes models/<name>.yaml and returns the message of building it (or "no error").
  std::string build(const std::string& name, const std::string& yaml, const std::string& params = "{}",
                    const ModelInputs& in = {false, {2, 1, 8, 8}, 10}) {
    std::ofstream(cat(dir_, "/", name, ".yaml")) << yaml;
    ModelConfig c = zoo(name, params);
    c.zoo_dir = dir_;
    return message(c, in);
  }
  static std::string message(const ModelConfig& c, const ModelInputs& in) {
    Graph g;
    try {
      build_model(g, c, in, true);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ExitCode::bad_input) << e.what();
      return e.what();
    }
    return "no error";
  }
  std::string file(const std::string& name) const { return cat(dir_, "/", name, ".yaml"); }
  std::string dir_;
};

const char* kGptLike = R"(doc: test
init: gpt2
params: {n_layer: 1, n_head: 2, d_model: 8}
layers:
  - embedding: {name: wte, vocab: ${vocab}, dim: ${d_model}}
  - repeat:
      times: ${n_layer}
      layers:
        - transformer_block: {heads: ${n_head}, mlp_ratio: ${n_layr}}
  - tied_head: {to: wte}
)";

TEST_F(ModelErrors, BadExpressionNamesFileLineColumnAndKeyPath) {
  EXPECT_EQ(build("g", kGptLike, "{}", text(1, 4, 16)),
            file("g") +
                ":9:60: layers[1].repeat.layers[0].transformer_block.mlp_ratio: unknown name 'n_layr' "
                "(did you mean 'n_layer'?)");
}

TEST_F(ModelErrors, MisspelledNameInTheZooGpt) {
  std::ifstream in(kZoo + "/gpt.yaml");
  std::stringstream buf;
  buf << in.rdbuf();
  std::string yaml = buf.str();
  yaml.replace(yaml.find("heads: ${n_head}"), 16, "heads: ${n_heads}");
  EXPECT_EQ(build("gpt", yaml, "{}", text(1, 4, 16)),
            file("gpt") +
                ":12:38: layers[3].repeat.layers[0].transformer_block.heads: unknown name 'n_heads' "
                "(did you mean 'n_head'?)");
}

TEST_F(ModelErrors, UnknownLayerTypeWithHint) {
  EXPECT_EQ(build("m", "layers:\n  - flatten\n  - linaer: {out: 10}\n"),
            file("m") + ":3:5: layers[1]: unknown layer type 'linaer' (did you mean 'linear'?)");
}

TEST_F(ModelErrors, UnknownOptionAndWrongType) {
  EXPECT_EQ(build("m", "layers:\n  - flatten\n  - linear: {out: 10, bais: false}\n"),
            file("m") +
                ":3:23: layers[1].linear.bais: unknown option of linear (did you mean 'bias'?); its options: "
                "out, bias, init, sbp, name, recompute");
  EXPECT_EQ(build("m", "layers:\n  - flatten\n  - linear: {out: ten}\n"),
            file("m") + ":3:19: layers[1].linear.out: expected an integer, got 'ten' (string)");
  EXPECT_EQ(build("m", "layers:\n  - flatten\n  - linear:\n      out: 10\n      bias: ${1}\n"),
            file("m") + ":5:13: layers[1].linear.bias: expected true or false, got 1 (integer)");
}

TEST_F(ModelErrors, UnknownParameterOverrideNamesTheConfigOrigin) {
  std::ofstream(cat(dir_, "/g.yaml")) << kGptLike;
  ModelConfig c = zoo("g", "{n_heads: 4}");
  c.zoo_dir = dir_;
  c.origins["n_heads"] = Origin{"run.yaml", 5, 5, ""};
  EXPECT_EQ(message(c, text(1, 4, 16)),
            "run.yaml:5:5: model.n_heads: unknown parameter of zoo model 'g' (did you mean 'n_head'?); its "
            "parameters: "
            "n_layer, n_head, d_model");
  c.params = YAML::Load("{n_head: 2.5}");
  c.origins["n_head"] = Origin{"", 0, 0, "model.n_head=2.5"};
  EXPECT_EQ(message(c, text(1, 4, 16)),
            "--set model.n_head=2.5: model.n_head: expected an integer like the default 2, got 2.5 (number)");
}

TEST_F(ModelErrors, ResnetDepthNamesDepth) {
  ModelConfig c = zoo("resnet", "{depth: 21}");
  c.origins["depth"] = Origin{"run.yaml", 3, 10, ""};
  EXPECT_EQ(message(c, images(2, 3, 32, 32, 10)),
            "run.yaml:3:10: model.depth: must be 6n+2 for basic blocks (e.g. 8, 14, 20), got 21");
  c.params = YAML::Load("{depth: 21, block: bottleneck}");
  EXPECT_EQ(message(c, images(2, 3, 32, 32, 10)),
            "run.yaml:3:10: model.depth: must be 9n+2 for bottleneck blocks (e.g. 11, 20, 29), got 21");
  c.params = YAML::Load("{block: basik}");
  EXPECT_EQ(message(c, images(2, 3, 32, 32, 10)), "model.block: must be basic or bottleneck, got 'basik'");
}

TEST_F(ModelErrors, MissingZooModelListsTheAvailableOnes) {
  EXPECT_EQ(message(zoo("gtp"), text(1, 4, 16)),
            cat("model.zoo: unknown zoo model 'gtp' (did you mean 'gpt'?) in ", kZoo,
                "; available: bert, cnn, gpt, llama, mlp, resnet, vit"));
}

TEST_F(ModelErrors, ShapeProblemsNameTheLayer) {
  EXPECT_EQ(build("m", "layers:\n  - linear: {out: 10}\n"),
            file("m") +
                ": layers: the model's output is [2,1,8,10] but the loss needs (B, num_classes) = [2,10] "
                "(end the layers with flatten and linear: {out: ${num_classes}})");
  EXPECT_EQ(build("m", "layers:\n  - embedding: {vocab: 10, dim: 4}\n"),
            file("m") + ":2:5: layers[0].embedding: embedding needs integer token ids (text data), got f32");
  EXPECT_EQ(build("m", "layers:\n  - residual: {layers: [{conv2d: {out: 3, kernel: 1}}]}\n"),
            file("m") +
                ":2:5: layers[0].residual: the layers give [2,3,8,8] but the shortcut gives [2,1,8,8]: "
                "add a `shortcut:` projection");
  // A graph op's own message, prefixed with the layer's position.
  EXPECT_EQ(build("m", "params: {k: 3}\nlayers:\n  - maxpool: {kernel: ${k * 9}}\n")
                .rfind(file("m") + ":3:5: layers[0].maxpool: ", 0),
            0u);
}

TEST_F(ModelErrors, NewLayersNameTheOption) {
  const ModelInputs t = text(2, 8, 16);
  const std::string emb = "layers:\n  - embedding: {vocab: 16, dim: 8}\n";
  EXPECT_EQ(build("m", emb + "  - attention: {heads: 4, kv_heads: 3}\n", "{}", t),
            file("m") +
                ":3:37: layers[1].attention.kv_heads: must divide heads 4 (each key/value head serves a "
                "group of heads), got 3");
  EXPECT_EQ(
      build("m", emb + "  - attention: {heads: 8, rope: true}\n", "{}", t),
      file("m") + ":3:5: layers[1].attention: rope needs an even head dimension, got width 8 / heads 8 = 1");
  EXPECT_EQ(build("m", emb + "  - attention: {heads: 2, qkv: split}\n", "{}", t),
            file("m") + ":3:32: layers[1].attention.qkv: expected one of fused, separate, got 'split'");
  EXPECT_EQ(build("m", emb + "  - transformer_block: {heads: 2, ffn: 8, mlp_ratio: 2}\n", "{}", t),
            file("m") + ":3:40: layers[1].transformer_block.ffn: give either ffn or mlp_ratio, not both");
  EXPECT_EQ(
      build("m", emb + "  - reshape: {shape: [3, -1]}\n", "{}", t),
      file("m") +
          ":3:22: layers[1].reshape.shape: cannot view the 64 elements per sample of [2,8,8] as [3,-1]");
  EXPECT_EQ(build("m", emb + "  - select: {axis: 0}\n", "{}", t),
            file("m") +
                ":3:20: layers[1].select.axis: axis 0 is not a per-sample axis of an input of rank 3 (1..2, "
                "or -1..-2; axis 0 is the batch)");
  EXPECT_EQ(build("m", emb + "  - select: {axis: 1, index: 8}\n", "{}", t),
            file("m") + ":3:30: layers[1].select.index: 8 is out of range for axis 1 of length 8");
  EXPECT_EQ(
      build("m", "layers:\n  - patch_embed: {patch: 3, dim: 4}\n"),
      file("m") + ":2:26: layers[0].patch_embed.patch: the image 8x8 is not a whole number of 3x3 patches");
  EXPECT_EQ(build("m", emb + "  - mlm_mask: {vocab: 16, mask_id: 16}\n", "{}", t),
            file("m") +
                ":3:5: layers[1].mlm_mask: mlm_mask needs the (B, T) token ids of text data (put it first), "
                "got f32 [2,8,8]");
  EXPECT_EQ(build("m", emb + "  - mul: {from: x}\n", "{}", t),
            file("m") + ":3:17: layers[1].mul.from: no saved value 'x'; save one with `- save: {name: ...}`");
}

TEST_F(ModelErrors, ExpressionColumnsAfterEarlierExpressionsOnTheLine) {
  EXPECT_EQ(build("m", "params: {width: 4}\nlayers:\n  - conv2d: {out: ${width}, kernel: ${widht}}\n"),
            file("m") + ":3:37: layers[0].conv2d.kernel: unknown name 'widht' (did you mean 'width'?)");
}

}  // namespace
}  // namespace flowrun
