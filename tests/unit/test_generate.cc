// Generation with a key/value cache: every step's logits against the full forward pass of the eval program
// on the whole sequence (causal, so position t's logits see tokens 0..t only), for GPT (learned positions)
// and Llama (rotary positions, grouped-query attention), through prefill, multi-token and single-token
// steps; the program cache by step length; and the sampler.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "data/dataset.h"
#include "nn/model.h"
#include "train/generate.h"
#include "train/program.h"

namespace flowrun {
namespace {

constexpr int64_t kContext = 16, kVocab = 256, kBatch = 2;

RunConfig decoder_config(const std::string& model, const std::string& dtype = "fp32") {
  return load_config_text(cat("model:\n", model, "data:\n  dataset: kjv\n  seq_len: ", kContext,
                              "\nprecision:\n  dtype: ", dtype, "\ntrain:\n  batch_size: ", kBatch, "\n"),
                          "decoder.yaml");
}

struct Reference {
  std::map<std::string, Tensor> params;
  Tensor logits;  // (B, kContext, V) of the eval program (fp32)
  std::vector<int64_t> tokens;
};

// Random parameters and tokens, and the full forward pass's logits of the whole sequence.
Reference full_forward(const RunConfig& cfg) {
  DataSpec spec;
  spec.text = true;
  spec.sample_shape = {kContext};
  spec.num_classes = kVocab;
  RunConfig fp32 = cfg;
  fp32.precision.dtype = "fp32";
  BuiltModel m;
  Executor ex(compile_model(fp32, spec, kBatch, false, &m), kCpu, 1);
  init_parameters(m.init, 7, [&](const std::string& n) -> Tensor& { return ex.tensor(n); });
  Reference r;
  const RngStream rng{3, 4};
  for (int64_t i = 0; i < kBatch * kContext; ++i)
    r.tokens.push_back(static_cast<int64_t>(rng.uniform(static_cast<uint64_t>(i)) * kVocab));
  std::copy(r.tokens.begin(), r.tokens.end(), ex.tensor("x").data<int64_t>());
  std::fill_n(ex.tensor("y").data<int64_t>(), kBatch * kContext, 0);
  ex.run();
  r.logits = ex.output("logits").clone();
  for (const std::string& n : persistent_names(ex.program(), ValueKind::param))
    r.params[n] = ex.tensor(n).clone();
  return r;
}

// Steps through the sequence in pieces of `lengths` (the first is the prefill) and compares each step's
// logits with the full pass's at the same positions; returns the largest |difference| / max |logit|.
double worst_step_error(const RunConfig& cfg, const std::vector<int64_t>& lengths,
                        std::vector<int64_t>* compiled) {
  const Reference ref = full_forward(cfg);
  Decoder dec(
      cfg, kVocab, kBatch, kContext, [&](const Program&, const BuiltModel&) { return ref.params; }, "test");
  double scale = 0, worst = 0;
  for (int64_t i = 0; i < ref.logits.numel(); ++i)
    scale = std::max(scale, std::fabs(double(ref.logits.data<float>()[i])));
  int64_t pos = 0;
  for (int64_t len : lengths) {
    std::vector<int64_t> x;
    for (int64_t b = 0; b < kBatch; ++b)
      x.insert(x.end(), ref.tokens.begin() + b * kContext + pos,
               ref.tokens.begin() + b * kContext + pos + len);
    const Tensor got = dec.step(x, len, pos);
    EXPECT_EQ(got.shape(), (Shape{kBatch, len, kVocab}));
    for (int64_t b = 0; b < kBatch; ++b)
      for (int64_t t = 0; t < len; ++t)
        for (int64_t v = 0; v < kVocab; ++v) {
          const float g = got.data<float>()[(b * len + t) * kVocab + v];
          const float e = ref.logits.data<float>()[(b * kContext + pos + t) * kVocab + v];
          worst = std::max(worst, std::fabs(double(g) - double(e)) / scale);
        }
    pos += len;
  }
  *compiled = dec.compiled();
  return worst;
}

const std::string kGpt = "  zoo: gpt\n  n_layer: 2\n  n_head: 2\n  d_model: 32\n";
const std::string kLlama = "  zoo: llama\n  n_layer: 2\n  n_head: 4\n  n_kv_head: 2\n  d_model: 32\n";

TEST(Generate, GptStepsMatchTheFullForwardPass) {
  std::vector<int64_t> compiled;
  // Prefill 5, a chunk of 3, then single tokens to the end of the context.
  std::vector<int64_t> lengths{5, 3};
  lengths.resize(lengths.size() + 8, 1);
  EXPECT_LT(worst_step_error(decoder_config(kGpt), lengths, &compiled), 1e-5);
  // The first program is the decode step's (the parameters load into it), then one per new length.
  EXPECT_EQ(compiled, (std::vector<int64_t>{1, 5, 3}));
}

TEST(Generate, LlamaStepsMatchTheFullForwardPass) {
  std::vector<int64_t> compiled;
  std::vector<int64_t> lengths{7};
  lengths.resize(lengths.size() + 9, 1);
  EXPECT_LT(worst_step_error(decoder_config(kLlama), lengths, &compiled), 1e-5);
  EXPECT_EQ(compiled, (std::vector<int64_t>{1, 7}));
}

// bf16 runs the matmuls in bf16 (the caches stay f32): the logits follow fp32's to bf16 rounding.
TEST(Generate, Bf16StepsFollowFp32) {
  std::vector<int64_t> compiled;
  std::vector<int64_t> lengths{4};
  lengths.resize(lengths.size() + 12, 1);
  const double err = worst_step_error(decoder_config(kGpt, "bf16"), lengths, &compiled);
  EXPECT_GT(err, 0);  // really in bf16
  EXPECT_LT(err, 0.05);
}

TEST(Generate, EncodersDoNotDecode) {
  const RunConfig cfg = decoder_config("  zoo: gpt\n  n_layer: 1\n  n_head: 2\n  d_model: 16\n");
  RunConfig bidir = cfg;
  bidir.model.zoo = "bert";
  bidir.model.params = YAML::Load("{n_layer: 1, n_head: 2, d_model: 16}");
  const auto none = [](const Program&, const BuiltModel&) { return std::map<std::string, Tensor>{}; };
  EXPECT_THROW(Decoder(bidir, kVocab, 1, kContext, none, "test"), Error);
}

TEST(Generate, SamplerIsGreedyAtZeroTemperatureAndCutsTopKAndTopP) {
  const std::vector<float> logits{0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  // Greedy: the first of the equal maxima.
  EXPECT_EQ(sample_token(logits.data(), 5, 0.0, 0, 1.0, 0.99), 1);
  // top_k = 1 and a tiny top_p leave only that token.
  for (double u : {0.0, 0.5, 0.999}) {
    EXPECT_EQ(sample_token(logits.data(), 5, 1.0, 1, 1.0, u), 1);
    EXPECT_EQ(sample_token(logits.data(), 5, 1.0, 0, 1e-6, u), 1);
  }
  // top_k = 2: only tokens 1 and 3 (equal), half the draws each.
  EXPECT_EQ(sample_token(logits.data(), 5, 1.0, 2, 1.0, 0.25), 1);
  EXPECT_EQ(sample_token(logits.data(), 5, 1.0, 2, 1.0, 0.75), 3);
}

TEST(Generate, SamplerDrawsTheSoftmaxDistribution) {
  const std::vector<float> logits{1.0f, 0.0f, -0.5f, 2.0f};
  const double temperature = 0.7;
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp(logits[i] / temperature);
  const int n = 10000;
  std::vector<int> counts(logits.size());
  for (int k = 0; k < n; ++k)
    ++counts[static_cast<size_t>(sample_token(logits.data(), 4, temperature, 0, 1.0, (k + 0.5) / n))];
  // An evenly spaced u gives each token its probability to within one draw.
  for (size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(counts[i], n * p[i] / sum, 1.0) << "token " << i;
}

TEST(Generate, PromptsAreBytesOrTokenIds) {
  EXPECT_EQ(prompt_tokens("Hi\n", 256), (std::vector<int64_t>{72, 105, 10}));
  EXPECT_EQ(prompt_tokens(" 5 17\t300 ", 50257), (std::vector<int64_t>{5, 17, 300}));
  EXPECT_THROW(prompt_tokens("5 x", 50257), Error);
  EXPECT_THROW(prompt_tokens("5 50257", 50257), Error);
}

}  // namespace
}  // namespace flowrun
