// Kernel benchmarks: single-op programs run through the executor (so what is timed is what training runs),
// reporting GFLOP/s from each op's registered cost, beside the machine's sgemm ceiling measured in the same
// process. Run: build/tests/flowrun_bench (its table and how to read it: lib/ops/README.md).
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>

#include <vector>

#include "graph/builder.h"
#include "ops/cpu/dnnl_matmul.h"
#include "runtime/executor.h"

namespace flowrun {
namespace {

struct OpCase {
  std::string op;
  std::vector<TensorType> inputs;
  Attrs attrs;
  bool backward = false;  // time forward + backward (the op's gradient graph) instead of forward only
};

void run_case(benchmark::State& state, const OpCase& c) {
  Graph g;
  GraphBuilder b(g);
  std::vector<ValueId> ins;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const std::string name = cat("x", i);
    ins.push_back(c.backward && is_floating(c.inputs[i].dtype) ? b.param(name, c.inputs[i].shape, c.inputs[i].dtype)
                                                               : b.input(name, c.inputs[i].shape, c.inputs[i].dtype));
  }
  const auto outs = b.op(c.op, ins, c.attrs);
  CompileOptions opts;
  if (c.backward) {
    g.mark_output("loss", b.reduce_sum(outs[0], {}));
  } else {
    opts.loss = "";
    g.mark_output("y", outs[0]);
  }
  std::vector<TensorType> in_t, out_t;
  for (ValueId v : ins) in_t.push_back(g.value(v).type);
  for (ValueId v : outs) out_t.push_back(g.value(v).type);
  const Cost cost = OpRegistry::get().at(c.op).cost(in_t, out_t, c.attrs);
  Executor ex(compile(std::move(g), opts));
  for (auto& [name, t] : ex.persistent()) {
    if (!is_floating(t.dtype())) continue;
    std::vector<double> v(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>((i * 7919) % 997) / 997.0 - 0.5;
    ex.tensor(name).fill_from(v);
  }
  ex.run();
  for (auto _ : state) ex.run();
  // Backward costs about twice the forward for the ops here (two products per forward product).
  const double flops = cost.flops * (c.backward ? 3.0 : 1.0);
  state.counters["GFLOPS"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_sgemm_ceiling(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(static_cast<size_t>(n) * n, 0.25f), c(static_cast<size_t>(n) * n);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOPS"] =
      benchmark::Counter(2.0 * n * n * static_cast<double>(n) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_sgemm_ceiling)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();

// The same product through dnnl_matmul, as flowrun's f32 GEMMs run (oneDNN's matmul; on AVX2 hosts
// gemm_avx2): on an AVX-512 machine with two 512-bit FMA pipes it is the faster ceiling, ~1.6x OpenBLAS
// 0.3.21's sgemm.
void BM_sgemm_ceiling_onednn(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> a(static_cast<size_t>(n * n), 0.5f), b(static_cast<size_t>(n * n), 0.25f),
      c(static_cast<size_t>(n * n));
  for (auto _ : state) {
    cpu::dnnl_matmul(DType::f32, DType::f32, 1, n, n, n, false, false, 0, 0, 1.0f, 0.0f, a.data(), b.data(),
                     c.data());
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOPS"] = benchmark::Counter(2.0 * static_cast<double>(n * n * n) * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_sgemm_ceiling_onednn)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();

// The machine's f32 multiply-add ceiling: every OpenMP thread runs 12 independent chains of fused
// multiply-adds, one register each (zmm on AVX-512, ymm otherwise: 12 chains of ymm pairs spilled AVX2's 16
// registers and measured 13 GFLOP/s on a Zen 3 host), enough to cover the FMA latency on two pipes, with
// nothing read from memory. On the 2-core AMX bench host
// (2026-12-06) 300-400 GFLOP/s at 2 threads as the host's speed moved, oneDNN's 2048^3 sgemm at 63-70% of
// it, torch.mm at 85-91%.
void BM_fma_peak(benchmark::State& state) {
#if defined(__AVX512F__)
  constexpr int kLanes = 16;
#else
  constexpr int kLanes = 8;
#endif
  using V = float __attribute__((vector_size(4 * kLanes)));
  constexpr int kChains = 12;
  constexpr int64_t kIters = 1 << 20;
  int threads = 1;
  for (auto _ : state) {
    float sink = 0;
#pragma omp parallel reduction(+ : sink)
    {
#pragma omp single
      threads = omp_get_num_threads();
      V acc[kChains];
      for (int i = 0; i < kChains; ++i) acc[i] = V{} + 0.001f * static_cast<float>(i + 1);
      const V m = V{} + 0.999999f, a = V{} + 1e-7f;
      for (int64_t it = 0; it < kIters; ++it)
#pragma GCC unroll 12
        for (int i = 0; i < kChains; ++i) acc[i] = acc[i] * m + a;
      for (int i = 0; i < kChains; ++i) sink += acc[i][0] + acc[i][kLanes - 1];
    }
    benchmark::DoNotOptimize(sink);
  }
  state.counters["GFLOPS"] =
      benchmark::Counter(2.0 * kLanes * kChains * static_cast<double>(kIters) * threads * 1e-9,
                         benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_fma_peak)->Unit(benchmark::kMillisecond)->UseRealTime();

const DType f32 = DType::f32;
const DType bf16 = DType::bf16;

void register_cases() {
  const std::vector<std::pair<std::string, OpCase>> cases = {
      {"matmul/mlp_128x784x512", {"matmul", {{{128, 784}, f32}, {{784, 512}, f32}}, {}}},
      {"matmul/1024^3", {"matmul", {{{1024, 1024}, f32}, {{1024, 1024}, f32}}, {}}},
      {"matmul/gpt_2048x256x1024", {"matmul", {{{2048, 256}, f32}, {{256, 1024}, f32}}, {}}},
      {"matmul/gpt_dw_256x2048x1024",
       {"matmul", {{{2048, 256}, f32}, {{2048, 1024}, f32}}, {{"trans_a", true}}}},
      {"matmul/gpt_dw_1024x2048x256",
       {"matmul", {{{2048, 1024}, f32}, {{2048, 256}, f32}}, {{"trans_a", true}}}},
      {"matmul/gpt_dx_2048x1024x256", {"matmul", {{{2048, 1024}, f32}, {{1024, 256}, f32}}, {}}},
      {"matmul/bf16_1024^3", {"matmul", {{{1024, 1024}, DType::bf16}, {{1024, 1024}, DType::bf16}}, {}}},
      // gpt-tiny's MLP products in bf16: an input gradient (dy W) and the weight gradients (dy^T x, f32 out).
      {"matmul/bf16_gpt_dx_2048x1024x256", {"matmul", {{{2048, 1024}, bf16}, {{1024, 256}, bf16}}, {}}},
      {"matmul/bf16_gpt_dw_1024x2048x256",
       {"matmul",
        {{{2048, 1024}, bf16}, {{2048, 256}, bf16}},
        {{"trans_a", true}, {"out_dtype", std::string("f32")}}}},
      {"matmul/bf16_gpt_dw_256x2048x1024",
       {"matmul",
        {{{2048, 256}, bf16}, {{2048, 1024}, bf16}},
        {{"trans_a", true}, {"out_dtype", std::string("f32")}}}},
      {"linear/fwd+bwd_2048x256->1024",
       {"linear", {{{2048, 256}, f32}, {{1024, 256}, f32}, {{1024}, f32}}, {}, true}},
      // The bench CNN's classifier (3136 -> 128, batch 64): x W^T, dy W and dy^T x.
      {"linear/cnn_fc_64x3136->128", {"linear", {{{64, 3136}, f32}, {{128, 3136}, f32}, {{128}, f32}}, {}}},
      {"matmul/cnn_fc_dx_64x128x3136", {"matmul", {{{64, 128}, f32}, {{128, 3136}, f32}}, {}}},
      {"matmul/cnn_fc_dw_128x64x3136",
       {"matmul", {{{64, 128}, f32}, {{64, 3136}, f32}}, {{"trans_a", true}}}},
      {"conv2d/cnn_64x32x14x14_k3x64",
       {"conv2d",
        {{{64, 32, 14, 14}, f32}, {{64, 32, 3, 3}, f32}, {{64}, f32}},
        {{"padding", std::vector<int64_t>{1, 1}}}}},
      // The bench CNN's first layer (1 channel), y and dy in nChw8c as its step on an AVX2 host has them:
      // there the weight gradient is cpu/conv_wgrad_few_f32.cc's, the forward pass oneDNN's (an own forward
      // pass like it, 12 pixels by 8 channels per step, ran at 42 GFLOP/s against oneDNN's 97 on 2 threads,
      // Zen 3).
      {"conv2d/cnn_nChw8c_64x1x28x28_k3x32",
       {"conv2d",
        {{{64, 1, 28, 28}, f32}, {{32, 1, 3, 3}, f32}, {{32}, f32}},
        {{"padding", std::vector<int64_t>{1, 1}}, {"y_blocked", true}, {"nchw8c", true}}}},
      {"conv2d_grad_weight/cnn_nChw8c_64x1x28x28_k3x32",
       {"conv2d_grad_weight",
        {{{64, 32, 28, 28}, f32}, {{64, 1, 28, 28}, f32}},
        {{"padding", std::vector<int64_t>{1, 1}},
         {"w_shape", std::vector<int64_t>{32, 1, 3, 3}},
         {"y_blocked", true},
         {"nchw8c", true}}}},
      // The f32 weight gradients of the bench CNN's second layer and ResNet-20's layers, x and dy in nChw8c
      // as their steps on an AVX2 host have them (cpu/conv_wgrad8_f32.cc).
      {"conv2d_grad_weight/cnn_nChw8c_64x32x14x14_k3x64",
       {"conv2d_grad_weight",
        {{{64, 64, 14, 14}, f32}, {{64, 32, 14, 14}, f32}},
        {{"padding", std::vector<int64_t>{1, 1}},
         {"w_shape", std::vector<int64_t>{64, 32, 3, 3}},
         {"x_blocked", true},
         {"y_blocked", true},
         {"nchw8c", true}}}},
      {"conv2d_grad_weight/resnet_nChw8c_64x16x32x32_k3x16",
       {"conv2d_grad_weight",
        {{{64, 16, 32, 32}, f32}, {{64, 16, 32, 32}, f32}},
        {{"padding", std::vector<int64_t>{1, 1}},
         {"w_shape", std::vector<int64_t>{16, 16, 3, 3}},
         {"x_blocked", true},
         {"y_blocked", true},
         {"nchw8c", true}}}},
      {"conv2d_grad_weight/resnet_nChw8c_64x64x8x8_k3x64",
       {"conv2d_grad_weight",
        {{{64, 64, 8, 8}, f32}, {{64, 64, 8, 8}, f32}},
        {{"padding", std::vector<int64_t>{1, 1}},
         {"w_shape", std::vector<int64_t>{64, 64, 3, 3}},
         {"x_blocked", true},
         {"y_blocked", true},
         {"nchw8c", true}}}},
      {"conv2d_grad_weight/resnet_nChw8c_64x16x32x32_k3x32_s2",
       {"conv2d_grad_weight",
        {{{64, 32, 16, 16}, f32}, {{64, 16, 32, 32}, f32}},
        {{"padding", std::vector<int64_t>{1, 1}},
         {"stride", std::vector<int64_t>{2, 2}},
         {"w_shape", std::vector<int64_t>{32, 16, 3, 3}},
         {"x_blocked", true},
         {"y_blocked", true},
         {"nchw8c", true}}}},
      // ResNet-20's f32 forward and input-gradient passes and the bench CNN's second layer, x and y in nChw8c
      // as their steps on an AVX2 host have them (cpu/conv_direct8_f32.cc).
      {"conv2d/resnet_nChw8c_64x16x32x32_k3x16",
       {"conv2d",
        {{{64, 16, 32, 32}, f32}, {{16, 16, 3, 3}, f32}},
        {{"padding", std::vector<int64_t>{1, 1}},
         {"x_blocked", true},
         {"y_blocked", true},
         {"nchw8c", true}}}},
      {"conv2d/resnet_nChw8c_64x32x16x16_k3x32",
       {"conv2d",
        {{{64, 32, 16, 16}, f32}, {{32, 32, 3, 3}, f32}},
        {{"padding", std::vector<int64_t>{1, 1}},
         {"x_blocked", true},
         {"y_blocked", true},
         {"nchw8c", true}}}},
      {"conv2d/resnet_nChw8c_64x64x8x8_k3x64",
       {"conv2d",
        {{{64, 64, 8, 8}, f32}, {{64, 64, 3, 3}, f32}},
        {{"padding", std::vector<int64_t>{1, 1}},
         {"x_blocked", true},
         {"y_blocked", true},
         {"nchw8c", true}}}},
      {"conv2d_grad_input/resnet_nChw8c_64x16x32x32_k3x16",
       {"conv2d_grad_input",
        {{{64, 16, 32, 32}, f32}, {{16, 16, 3, 3}, f32}},
        {{"padding", std::vector<int64_t>{1, 1}},
         {"in_shape", std::vector<int64_t>{64, 16, 32, 32}},
         {"x_blocked", true},
         {"y_blocked", true},
         {"nchw8c", true}}}},
      {"conv2d_grad_input/resnet_nChw8c_64x64x8x8_k3x64",
       {"conv2d_grad_input",
        {{{64, 64, 8, 8}, f32}, {{64, 64, 3, 3}, f32}},
        {{"padding", std::vector<int64_t>{1, 1}},
         {"in_shape", std::vector<int64_t>{64, 64, 8, 8}},
         {"x_blocked", true},
         {"y_blocked", true},
         {"nchw8c", true}}}},
      {"conv2d/cnn_nChw8c_64x32x14x14_k3x64",
       {"conv2d",
        {{{64, 32, 14, 14}, f32}, {{64, 32, 3, 3}, f32}, {{64}, f32}},
        {{"padding", std::vector<int64_t>{1, 1}},
         {"x_blocked", true},
         {"y_blocked", true},
         {"nchw8c", true}}}},
      {"conv2d/resnet_64x16x32x32_k3x16",
       {"conv2d",
        {{{64, 16, 32, 32}, f32}, {{16, 16, 3, 3}, f32}},
        {{"padding", std::vector<int64_t>{1, 1}}}}},
      {"conv2d/fwd+bwd_64x32x14x14_k3x64",
       {"conv2d",
        {{{64, 32, 14, 14}, f32}, {{64, 32, 3, 3}, f32}},
        {{"padding", std::vector<int64_t>{1, 1}}},
        true}},
      // ResNet-20's three stages' weight gradients in bf16 (wgrad3x3_bf16).
      {"conv2d_grad_weight/bf16_64x16x32x32_k3x16",
       {"conv2d_grad_weight",
        {{{64, 16, 32, 32}, DType::bf16}, {{64, 16, 32, 32}, DType::bf16}},
        {{"padding", std::vector<int64_t>{1, 1}}, {"w_shape", std::vector<int64_t>{16, 16, 3, 3}}}}},
      {"conv2d_grad_weight/bf16_nChw16c_64x16x32x32_k3x16",
       {"conv2d_grad_weight",
        {{{64, 16, 32, 32}, DType::bf16}, {{64, 16, 32, 32}, DType::bf16}},
        {{"padding", std::vector<int64_t>{1, 1}},
         {"w_shape", std::vector<int64_t>{16, 16, 3, 3}},
         {"x_blocked", true},
         {"y_blocked", true}}}},
      {"conv2d_grad_weight/bf16_64x32x16x16_k3x32",
       {"conv2d_grad_weight",
        {{{64, 32, 16, 16}, DType::bf16}, {{64, 32, 16, 16}, DType::bf16}},
        {{"padding", std::vector<int64_t>{1, 1}}, {"w_shape", std::vector<int64_t>{32, 32, 3, 3}}}}},
      {"conv2d_grad_weight/bf16_64x64x8x8_k3x64",
       {"conv2d_grad_weight",
        {{{64, 64, 8, 8}, DType::bf16}, {{64, 64, 8, 8}, DType::bf16}},
        {{"padding", std::vector<int64_t>{1, 1}}, {"w_shape", std::vector<int64_t>{64, 64, 3, 3}}}}},
      // The same in nChw16c, as a bf16 ResNet runs them (wino3x3_bf16_wgrad).
      {"conv2d_grad_weight/bf16_nChw16c_64x32x16x16_k3x32",
       {"conv2d_grad_weight",
        {{{64, 32, 16, 16}, DType::bf16}, {{64, 32, 16, 16}, DType::bf16}},
        {{"padding", std::vector<int64_t>{1, 1}},
         {"w_shape", std::vector<int64_t>{32, 32, 3, 3}},
         {"x_blocked", true},
         {"y_blocked", true}}}},
      {"conv2d_grad_weight/bf16_nChw16c_64x64x8x8_k3x64",
       {"conv2d_grad_weight",
        {{{64, 64, 8, 8}, DType::bf16}, {{64, 64, 8, 8}, DType::bf16}},
        {{"padding", std::vector<int64_t>{1, 1}},
         {"w_shape", std::vector<int64_t>{64, 64, 3, 3}},
         {"x_blocked", true},
         {"y_blocked", true}}}},
      // ResNet-20's 16-channel f32 forward pass as its step runs it, in nChw16c (direct3x3_f32).
      {"conv2d/f32_nChw16c_64x16x32x32_k3x16",
       {"conv2d",
        {{{64, 16, 32, 32}, f32}, {{16, 16, 3, 3}, f32}},
        {{"padding", std::vector<int64_t>{1, 1}}, {"x_blocked", true}, {"y_blocked", true}}}},
      // ResNet-20's 32-channel f32 weight gradient as its step runs it (direct3x3_f32_wgrad).
      {"conv2d_grad_weight/f32_nChw16c_64x16x32x32_k3x16",
       {"conv2d_grad_weight",
        {{{64, 16, 32, 32}, f32}, {{64, 16, 32, 32}, f32}},
        {{"padding", std::vector<int64_t>{1, 1}},
         {"w_shape", std::vector<int64_t>{16, 16, 3, 3}},
         {"x_blocked", true},
         {"y_blocked", true}}}},
      {"conv2d_grad_weight/f32_nChw16c_64x32x16x16_k3x32",
       {"conv2d_grad_weight",
        {{{64, 32, 16, 16}, f32}, {{64, 32, 16, 16}, f32}},
        {{"padding", std::vector<int64_t>{1, 1}},
         {"w_shape", std::vector<int64_t>{32, 32, 3, 3}},
         {"x_blocked", true},
         {"y_blocked", true}}}},
      // ResNet-20's stride-2 f32 weight gradients (16 -> 32 and 32 -> 64 channels) as its step runs them.
      {"conv2d_grad_weight/f32_nChw16c_64x16x32x32_k3x32_s2",
       {"conv2d_grad_weight",
        {{{64, 32, 16, 16}, f32}, {{64, 16, 32, 32}, f32}},
        {{"padding", std::vector<int64_t>{1, 1}},
         {"stride", std::vector<int64_t>{2, 2}},
         {"w_shape", std::vector<int64_t>{32, 16, 3, 3}},
         {"x_blocked", true},
         {"y_blocked", true}}}},
      {"conv2d_grad_weight/f32_nChw16c_64x32x16x16_k3x64_s2",
       {"conv2d_grad_weight",
        {{{64, 64, 8, 8}, f32}, {{64, 32, 16, 16}, f32}},
        {{"padding", std::vector<int64_t>{1, 1}},
         {"stride", std::vector<int64_t>{2, 2}},
         {"w_shape", std::vector<int64_t>{64, 32, 3, 3}},
         {"x_blocked", true},
         {"y_blocked", true}}}},
      // ResNet-20's three stages' bf16 forward and input-gradient passes in nChw16c (wino3x3_bf16).
      {"conv2d/bf16_nChw16c_64x16x32x32_k3x16",
       {"conv2d",
        {{{64, 16, 32, 32}, DType::bf16}, {{16, 16, 3, 3}, DType::bf16}},
        {{"padding", std::vector<int64_t>{1, 1}}, {"x_blocked", true}, {"y_blocked", true}}}},
      {"conv2d/bf16_nChw16c_64x32x16x16_k3x32",
       {"conv2d",
        {{{64, 32, 16, 16}, DType::bf16}, {{32, 32, 3, 3}, DType::bf16}},
        {{"padding", std::vector<int64_t>{1, 1}}, {"x_blocked", true}, {"y_blocked", true}}}},
      {"conv2d/bf16_nChw16c_64x64x8x8_k3x64",
       {"conv2d",
        {{{64, 64, 8, 8}, DType::bf16}, {{64, 64, 3, 3}, DType::bf16}},
        {{"padding", std::vector<int64_t>{1, 1}}, {"x_blocked", true}, {"y_blocked", true}}}},
      {"conv2d_grad_input/bf16_nChw16c_64x32x16x16_k3x32",
       {"conv2d_grad_input",
        {{{64, 32, 16, 16}, DType::bf16}, {{32, 32, 3, 3}, DType::bf16}},
        {{"padding", std::vector<int64_t>{1, 1}},
         {"in_shape", std::vector<int64_t>{64, 32, 16, 16}},
         {"x_blocked", true},
         {"y_blocked", true}}}},
      {"cast/f32_to_bf16_2048x256", {"cast", {{{2048, 256}, f32}}, {{"dtype", std::string("bf16")}}}},
      {"reduce_sum/bias_grad_2048x256",
       {"reduce_sum", {{{2048, 256}, f32}}, {{"axes", std::vector<int64_t>{0}}}}},
      {"reduce_sum/bias_grad_2048x1024",
       {"reduce_sum", {{{2048, 1024}, f32}}, {{"axes", std::vector<int64_t>{0}}}}},
      {"gelu/tanh_2048x1024", {"gelu", {{{2048, 1024}, f32}}, {{"approximate", std::string("tanh")}}}},
      {"gelu/bf16_tanh_2048x1024", {"gelu", {{{2048, 1024}, bf16}}, {{"approximate", std::string("tanh")}}}},
      {"gelu_grad/tanh_2048x1024",
       {"gelu_grad", {{{2048, 1024}, f32}, {{2048, 1024}, f32}}, {{"approximate", std::string("tanh")}}}},
      {"gelu_bias_grad/tanh_2048x1024",
       {"gelu_bias_grad",
        {{{2048, 1024}, f32}, {{2048, 1024}, f32}},
        {{"approximate", std::string("tanh")}}}},
      {"gelu_bias_grad/bf16_tanh_2048x1024",
       {"gelu_bias_grad",
        {{{2048, 1024}, bf16}, {{2048, 1024}, bf16}},
        {{"approximate", std::string("tanh")}}}},
      // The bench MLP's hidden layers' gradient and bias gradient, fused and as two ops.
      {"relu_bias_grad/128x512", {"relu_bias_grad", {{{128, 512}, f32}, {{128, 512}, f32}}, {}}},
      {"relu_bias_grad/2048x1024", {"relu_bias_grad", {{{2048, 1024}, f32}, {{2048, 1024}, f32}}, {}}},
      {"relu_grad/2048x1024", {"relu_grad", {{{2048, 1024}, f32}, {{2048, 1024}, f32}}, {}}},
      {"relu_grad/128x512", {"relu_grad", {{{128, 512}, f32}, {{128, 512}, f32}}, {}}},
      {"reduce_sum/bias_grad_128x512",
       {"reduce_sum", {{{128, 512}, f32}}, {{"axes", std::vector<int64_t>{0}}, {"keepdims", true}}}},
      {"gelu/fwd+bwd_tanh_2048x1024",
       {"gelu", {{{2048, 1024}, f32}}, {{"approximate", std::string("tanh")}}, true}},
      {"gelu/bf16_fwd+bwd_tanh_2048x1024",
       {"gelu", {{{2048, 1024}, bf16}}, {{"approximate", std::string("tanh")}}, true}},
      {"layernorm/2048x256", {"layernorm", {{{2048, 256}, f32}, {{256}, f32}, {{256}, f32}}, {}}},
      {"layernorm/residual_2048x256",
       {"layernorm",
        {{{2048, 256}, f32}, {{256}, f32}, {{256}, f32}, {{2048, 256}, f32}},
        {{"residual", true}}}},
      {"layernorm_grad/2048x256",
       {"layernorm_grad",
        {{{2048, 256}, f32}, {{2048, 256}, f32}, {{256}, f32}, {{2048}, f32}, {{2048}, f32}},
        {}}},
      {"layernorm_grad/residual_bf16_2048x256",
       {"layernorm_grad",
        {{{2048, 256}, f32},
         {{2048, 256}, f32},
         {{256}, f32},
         {{2048}, f32},
         {{2048}, f32},
         {{2048, 256}, f32}},
        {{"residual", true}, {"dx_bf16", true}}}},
      {"add/2048x256", {"add", {{{2048, 256}, f32}, {{2048, 256}, f32}}, {}}},
      // ResNet-20's first stage at batch 64 (running statistics f32 under bf16 activations), in NCHW and, as
      // the layout pass leaves it between convolutions, nChw16c.
      {"batchnorm/64x16x32x32",
       {"batchnorm",
        {{{64, 16, 32, 32}, f32}, {{16}, f32}, {{16}, f32}, {{16}, f32}, {{16}, f32}},
        {{"training", true}}}},
      {"batchnorm/bf16_64x16x32x32",
       {"batchnorm",
        {{{64, 16, 32, 32}, bf16}, {{16}, f32}, {{16}, f32}, {{16}, f32}, {{16}, f32}},
        {{"training", true}}}},
      {"batchnorm/bf16_nChw16c_64x16x32x32",
       {"batchnorm",
        {{{64, 16, 32, 32}, bf16}, {{16}, f32}, {{16}, f32}, {{16}, f32}, {{16}, f32}},
        {{"training", true}, {"blocked", true}}}},
      // A ResNet-20 block's input gradient: the add of its two parts and the previous relu's mask, unfused
      // and fused (relu_grad with the sum's second part as a third input).
      {"add/bf16_64x16x32x32", {"add", {{{64, 16, 32, 32}, bf16}, {{64, 16, 32, 32}, bf16}}, {}}},
      {"relu_grad/bf16_64x16x32x32", {"relu_grad", {{{64, 16, 32, 32}, bf16}, {{64, 16, 32, 32}, bf16}}, {}}},
      {"relu_grad/sum_bf16_64x16x32x32",
       {"relu_grad", {{{64, 16, 32, 32}, bf16}, {{64, 16, 32, 32}, bf16}, {{64, 16, 32, 32}, bf16}}, {}}},
      {"layernorm/fwd+bwd_2048x256",
       {"layernorm", {{{2048, 256}, f32}, {{256}, f32}, {{256}, f32}}, {}, true}},
      {"sdpa/causal_B16_H4_T128_D64",
       {"sdpa",
        {{{16, 4, 128, 64}, f32}, {{16, 4, 128, 64}, f32}, {{16, 4, 128, 64}, f32}},
        {{"causal", true}}}},
      {"sdpa/fwd+bwd_causal_B16_H4_T128_D64",
       {"sdpa",
        {{{16, 4, 128, 64}, f32}, {{16, 4, 128, 64}, f32}, {{16, 4, 128, 64}, f32}},
        {{"causal", true}},
        true}},
      {"sdpa/bf16_causal_B16_H4_T128_D64",
       {"sdpa",
        {{{16, 4, 128, 64}, bf16}, {{16, 4, 128, 64}, bf16}, {{16, 4, 128, 64}, bf16}},
        {{"causal", true}}}},
      {"sdpa/bf16_fwd+bwd_causal_B16_H4_T128_D64",
       {"sdpa",
        {{{16, 4, 128, 64}, bf16}, {{16, 4, 128, 64}, bf16}, {{16, 4, 128, 64}, bf16}},
        {{"causal", true}},
        true}},
      // The CPU's fused attention on gpt-tiny's packed projections (B16 T128, 4 heads of 64), beside the
      // sdpa cases above that it replaces with their transposes.
      {"sdpa_qkv/causal_B16_T128_H4_D64", {"sdpa_qkv", {{{16, 128, 768}, f32}}, {{"heads", int64_t{4}}}}},
      {"sdpa_qkv/fwd+bwd_causal_B16_T128_H4_D64",
       {"sdpa_qkv", {{{16, 128, 768}, f32}}, {{"heads", int64_t{4}}}, true}},
      {"sdpa_qkv/bf16_causal_B16_T128_H4_D64",
       {"sdpa_qkv", {{{16, 128, 768}, bf16}}, {{"heads", int64_t{4}}}}},
      {"sdpa_qkv/bf16_fwd+bwd_causal_B16_T128_H4_D64",
       {"sdpa_qkv", {{{16, 128, 768}, bf16}}, {{"heads", int64_t{4}}}, true}},
      {"sdpa/causal_B1_H12_T1024_D64",
       {"sdpa",
        {{{1, 12, 1024, 64}, f32}, {{1, 12, 1024, 64}, f32}, {{1, 12, 1024, 64}, f32}},
        {{"causal", true}}}},
  };
  for (const auto& [name, c] : cases)
    benchmark::RegisterBenchmark(name.c_str(), [c](benchmark::State& s) { run_case(s, c); })
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->MinTime(0.5);
}

}  // namespace
}  // namespace flowrun

int main(int argc, char** argv) {
  flowrun::register_cases();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
