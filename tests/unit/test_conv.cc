// conv2d backward kernels in f32 (oneDNN) against f64 (im2col), which the generic f32-vs-f64 test does not
// reach (it runs forwards only), and bitwise reproducibility of the f32 kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "op_harness.h"
#include "ops/cpu/conv.h"
#include "ops/cpu/conv_wgrad8_f32.h"
#include "ops/cpu/conv_wgrad_few_f32.h"
#include "ops/cpu/dnnl_conv.h"

namespace flowrun::testing {
namespace {

struct Arg {
  std::string name;
  Shape shape;
};

// A program running one op on the given inputs, all of dtype t, filled from a fixed seed.
std::unique_ptr<Executor> single_op(const std::string& op, const std::vector<Arg>& args, const Attrs& attrs,
                                    DType t) {
  Graph g;
  GraphBuilder b(g);
  std::vector<ValueId> ins;
  for (const Arg& a : args) ins.push_back(g.add_input(a.name, a.shape, t));
  g.mark_output("out", b.op1(op, ins, attrs));
  CompileOptions opts;
  opts.loss = "";
  auto ex = std::make_unique<Executor>(compile(std::move(g), opts), kCpu, 1);
  for (size_t i = 0; i < args.size(); ++i) {
    Tensor& x = ex->tensor(args[i].name);
    std::vector<double> v(static_cast<size_t>(x.numel()));
    const RngStream r{7, i};
    for (size_t k = 0; k < v.size(); ++k) v[k] = 2 * r.uniform(k) - 1;
    x.fill_from(v);
  }
  return ex;
}

std::vector<double> run_op(const std::string& op, const std::vector<Arg>& args, const Attrs& attrs, DType t) {
  auto ex = single_op(op, args, attrs, t);
  ex->run();
  return ex->output("out").to_f64();
}

Attrs with(const Attrs& a, const char* key, const Shape& s) {
  Attrs r = a;
  r.set(key, s);
  return r;
}

Shape conv_out(const Shape& x, const Shape& w, const Attrs& a) {
  return OpRegistry::get().at("conv2d").infer({{x, DType::f32}, {w, DType::f32}}, a)[0].shape;
}

void expect_close(const std::vector<double>& ref, const std::vector<double>& got) {
  ASSERT_EQ(ref.size(), got.size());
  double scale = 1e-3;
  for (double v : ref) scale = std::max(scale, std::fabs(v));
  for (size_t k = 0; k < ref.size(); ++k) EXPECT_NEAR(ref[k], got[k], 1e-4 * scale) << "[" << k << "]";
}

// A padded 3x3 convolution of x (n, c, h, w) by w (o, c, 3, 3) as its three ops: (op, (inputs, attrs)).
std::vector<std::pair<std::string, std::pair<std::vector<Arg>, Attrs>>> three_ops(
    const Shape& x, const Shape& w, const Attrs& a = {{"padding", Shape{1, 1}}}) {
  const Shape y = conv_out(x, w, a);
  return {
      {"conv2d", {{{"x", x}, {"w", w}}, a}},
      {"conv2d_grad_input", {{{"dy", y}, {"w", w}}, with(a, "in_shape", x)}},
      {"conv2d_grad_weight", {{{"dy", y}, {"x", x}}, with(a, "w_shape", w)}},
  };
}

// Every conv2d sample (strides, padding, dilation, groups, 1x1) through both backward ops.
TEST(ConvF32, BackwardKernelsMatchFloat64) {
  for (const OpSample& s : OpRegistry::get().at("conv2d").samples()) {
    SCOPED_TRACE(s.label);
    const Shape &x = s.inputs[0].shape, &w = s.inputs[1].shape, y = conv_out(x, w, s.attrs);
    const std::vector<Arg> gi = {{"dy", y}, {"w", w}}, gw = {{"dy", y}, {"x", x}};
    const Attrs ai = with(s.attrs, "in_shape", x), aw = with(s.attrs, "w_shape", w);
    expect_close(run_op("conv2d_grad_input", gi, ai, DType::f64),
                 run_op("conv2d_grad_input", gi, ai, DType::f32));
    expect_close(run_op("conv2d_grad_weight", gw, aw, DType::f64),
                 run_op("conv2d_grad_weight", gw, aw, DType::f32));
  }
}

// The NCHW tensor t (n, c, hw pixels) in layout l ("nchw", "nchw8c", "nchw16c" or "nhwc").
std::vector<float> in_layout(const Tensor& t, const std::string& l) {
  const int64_t n = t.shape()[0], c = t.shape()[1], hw = t.numel() / (n * c);
  const int64_t lanes = l == "nchw8c" ? 8 : 16;
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < hw; ++p) {
        const int64_t at = l == "nchw"   ? (i * c + ch) * hw + p
                           : l == "nhwc" ? (i * hw + p) * c + ch
                                         : ((i * (c / lanes) + ch / lanes) * hw + p) * lanes + ch % lanes;
        v[static_cast<size_t>(at)] = t.data<float>()[(i * c + ch) * hw + p];
      }
  return v;
}

// An own f32 weight-gradient kernel's interface, as dnnl_conv.cc's OwnWeightGradient calls it.
struct WgradKernel {
  bool (*fits)(const cpu::ConvGeom&);
  size_t (*scratch_bytes)(const cpu::ConvGeom&);
  int64_t (*partial_elems)(const cpu::ConvGeom&);
  void (*run)(const cpu::ConvGeom&, int64_t, int64_t, const float*, const float*, float*, void*);
  bool x_in_layout;  // x takes the layout too (the few-channel kernel's x is NCHW in every program)
};
struct WgradCase {
  Shape x, w;
  Attrs a;
};

// The kernel straight from its interface: dy (and x) in NCHW, nChw8c, nChw16c and NHWC give the same bits
// (each element one chain over images and pixels in order), close to the f64 op; split into two image blocks
// and finished (wgrad_few_f32_finish, both kernels' partial layout), the bits of the blocks' partials added
// in order; through the op, on AVX2 hosts without AVX-512 (oneDNN's nChw8c), the bits of one block.
void expect_one_sum_in_every_layout(const WgradKernel& kern, const std::vector<WgradCase>& cases) {
  for (const WgradCase& k : cases) {
    const Shape y = conv_out(k.x, k.w, k.a);
    SCOPED_TRACE(shape_str(k.x) + " " + shape_str(k.w));
    const std::vector<Arg> args = {{"dy", y}, {"x", k.x}};
    const Attrs aw = with(k.a, "w_shape", k.w);
    auto ex = single_op("conv2d_grad_weight", args, aw, DType::f32);
    const int64_t n = y[0];
    std::vector<float> first;
    for (const std::string name : {"nchw", "nchw8c", "nchw16c", "nhwc"}) {
      SCOPED_TRACE(name);
      const std::vector<float> dy = in_layout(ex->tensor("dy"), name),
                               x = in_layout(ex->tensor("x"), kern.x_in_layout ? name : "nchw");
      Attrs a = with(k.a, "w_shape", k.w);
      if (name != "nchw") {
        a.set("y_blocked", true);
        if (kern.x_in_layout) a.set("x_blocked", true);
      }
      if (name == "nchw8c" || name == "nhwc") a.set(name, true);
      const cpu::ConvGeom g = cpu::conv_geom(k.x, k.w, a);
      ASSERT_TRUE(kern.fits(g));
      std::vector<float> scratch(kern.scratch_bytes(g) / sizeof(float));
      const int64_t pe = kern.partial_elems(g);
      std::vector<float> partials(static_cast<size_t>(2 * pe)), dw(static_cast<size_t>(g.o * g.kdim()));
      kern.run(g, 0, n / 2, dy.data(), x.data(), partials.data(), scratch.data());
      kern.run(g, n / 2, n, dy.data(), x.data(), partials.data() + pe, scratch.data());
      cpu::wgrad_few_f32_finish(g, partials.data(), 2, pe, dw.data());
      if (first.empty()) {
        first = dw;
        const std::vector<double> ref = run_op("conv2d_grad_weight", args, aw, DType::f64);
        expect_close(ref, std::vector<double>(dw.begin(), dw.end()));
        if (cpu::convs_take_nchw8c() && n >= 2) {
          ex->run();
          const Tensor got = ex->output("out");
          std::vector<float> whole(static_cast<size_t>(pe)), one(dw.size());
          kern.run(g, 0, n, dy.data(), x.data(), whole.data(), scratch.data());
          cpu::wgrad_few_f32_finish(g, whole.data(), 1, pe, one.data());
          for (size_t i = 0; i < one.size(); ++i) ASSERT_EQ(got.data<float>()[i], one[i]) << i;
        }
      }
      EXPECT_EQ(first, dw);
    }
  }
}

// wgrad_few_f32 (fewer than 8 input channels; AVX2 hosts' weight gradient) on any AVX2 CPU, dy in each
// layout: strides, padding, dilation, a 2x3 and a 1x1 kernel, 1 to 7 channels.
TEST(ConvF32, FewChannelWeightGradientIsOneSumInEveryLayout) {
  if (!cpu::wgrad_few_f32_fits(cpu::conv_geom({1, 1, 4, 4}, {8, 1, 3, 3}, {})))
    GTEST_SKIP() << "no AVX2 on this machine";
  expect_one_sum_in_every_layout(
      {cpu::wgrad_few_f32_fits, cpu::wgrad_few_f32_scratch_bytes, cpu::wgrad_few_f32_partial_elems,
       cpu::wgrad_few_f32, false},
      {
          {{5, 1, 9, 11}, {16, 1, 3, 3}, {{"padding", Shape{1, 1}}}},
          {{3, 3, 8, 8}, {16, 3, 3, 3}, {{"padding", Shape{1, 1}}, {"stride", Shape{2, 2}}}},
          {{2, 2, 7, 9}, {16, 2, 2, 3}, {{"dilation", Shape{2, 2}}}},
          {{4, 7, 5, 5}, {32, 7, 1, 1}, {}},
      });
}

// wgrad8_f32 (input channels in multiples of 8, rows of 3 taps; AVX2 hosts' weight gradient) on any AVX2
// CPU, x and dy in each layout: padding, stride 2, dilation 2 with a 2 x 3 kernel, 16 to 32 channels.
TEST(ConvF32, EightChannelBlockWeightGradientIsOneSumInEveryLayout) {
  if (!cpu::wgrad8_f32_fits(cpu::conv_geom({1, 8, 4, 4}, {16, 8, 3, 3}, {})))
    GTEST_SKIP() << "no AVX2 on this machine";
  expect_one_sum_in_every_layout(
      {cpu::wgrad8_f32_fits, cpu::wgrad8_f32_scratch_bytes, cpu::wgrad8_f32_partial_elems, cpu::wgrad8_f32,
       true},
      {
          {{5, 16, 9, 11}, {16, 16, 3, 3}, {{"padding", Shape{1, 1}}}},
          {{3, 16, 8, 8}, {32, 16, 3, 3}, {{"padding", Shape{1, 1}}, {"stride", Shape{2, 2}}}},
          {{2, 32, 7, 9}, {16, 32, 2, 3}, {{"dilation", Shape{2, 2}}, {"padding", Shape{0, 2}}}},
      });
}

// A batch and width large enough that oneDNN splits the weight-gradient reduction over threads: the same
// inputs must give the same bits on every run, in one executor and across executors.
TEST(ConvF32, KernelsAreBitwiseReproducible) {
  const Shape x = {32, 16, 16, 16}, w = {16, 16, 3, 3};
  const auto ops = three_ops(x, w);
  for (const auto& [op, spec] : ops) {
    SCOPED_TRACE(op);
    auto ex = single_op(op, spec.first, spec.second, DType::f32);
    ex->run();
    const std::vector<double> first = ex->output("out").to_f64();
    ex->run();
    EXPECT_EQ(first, ex->output("out").to_f64());
    EXPECT_EQ(first, run_op(op, spec.first, spec.second, DType::f32));
  }
}

// nChw8c <-> nChw16c (the copies through which AVX-512's 16-channel kernels read an nChw8c graph) moves
// each element where the two reorders through NCHW put it, for 4- and 2-byte elements, on planes that are
// not a multiple of any vector.
TEST(Reorder, ChannelBlocksOfEightAndSixteenRegroupAsThroughNchw) {
  const int64_t n = 2, c = 32, hw = 7 * 5;
  for (size_t elem : {size_t{4}, size_t{2}}) {
    SCOPED_TRACE(elem);
    const size_t bytes = static_cast<size_t>(n * c * hw) * elem;
    std::vector<unsigned char> plain(bytes), eight(bytes), sixteen(bytes), out(bytes);
    for (size_t i = 0; i < bytes; ++i) plain[i] = static_cast<unsigned char>(i * 2654435761u >> 13);
    cpu::reorder_blocked(plain.data(), eight.data(), n, c, hw, elem, 8, true);
    cpu::reorder_blocked(plain.data(), sixteen.data(), n, c, hw, elem, 16, true);
    ASSERT_NE(eight, sixteen);
    cpu::regroup_blocked(eight.data(), out.data(), n, c, hw, elem, 8, 16);
    EXPECT_EQ(out, sixteen);
    cpu::regroup_blocked(sixteen.data(), out.data(), n, c, hw, elem, 16, 8);
    EXPECT_EQ(out, eight);
  }
}

// maxpool2d's 2x2 stride-2 kernel (vectorised for f32) chooses as the row-major scan of each window does:
// the first maximum, a NaN over a number, the later NaN over an earlier one. Inputs from a few values (ties
// everywhere, as after a ReLU) with NaNs; odd sizes (a row and column left over), rows wider than one
// vector step and narrower ones.
TEST(MaxPool, TwoByTwoChoosesAsTheRowMajorScan) {
  for (const Shape& xs : {Shape{2, 3, 7, 9}, Shape{1, 2, 6, 70}, Shape{2, 2, 28, 28}, Shape{1, 1, 4, 2}}) {
    SCOPED_TRACE(xs[2] * 1000 + xs[3]);
    Graph g;
    GraphBuilder b(g);
    const ValueId x = g.add_input("x", xs, DType::f32);
    const auto outs = b.op("maxpool2d", {x}, {{"kernel", std::vector<int64_t>{2, 2}}});
    g.mark_output("y", outs[0]);
    g.mark_output("idx", outs[1]);
    CompileOptions opts;
    opts.loss = "";
    Executor ex(compile(std::move(g), opts), kCpu, 1);
    float* xp = ex.tensor("x").data<float>();
    const int64_t n = ex.tensor("x").numel();
    for (int64_t i = 0; i < n; ++i)
      xp[i] = (i * 7919) % 13 == 0 ? std::nanf("") : static_cast<float>((i * 2654435761u >> 7) % 3);
    ex.run();
    const Tensor yt = ex.output("y"), it = ex.output("idx");
    const float* y = yt.data<float>();
    const int64_t* idx = it.data<int64_t>();
    const int64_t h = xs[2], w = xs[3], oh = h / 2, ow = w / 2;
    for (int64_t pl = 0; pl < xs[0] * xs[1]; ++pl)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          int64_t bi = 2 * oy * w + 2 * ox;
          float best = xp[pl * h * w + bi];
          for (int64_t k = 1; k < 4; ++k) {
            const int64_t i = (2 * oy + k / 2) * w + 2 * ox + k % 2;
            const float v = xp[pl * h * w + i];
            if (v > best || v != v) best = v, bi = i;
          }
          const int64_t o = (pl * oh + oy) * ow + ox;
          ASSERT_EQ(idx[o], bi) << "plane " << pl << " (" << oy << ", " << ox << ")";
          ASSERT_EQ(std::isnan(y[o]), std::isnan(best));
          if (!std::isnan(best)) {
            ASSERT_EQ(y[o], best);
          }
        }
  }
}

// The buffers the convolutions keep outside the arena (oneDNN's, wgrad3x3_bf16's repacks, wino3x3_bf16's
// weights and tiles) are what KernelDef::host_buffers (which `flowrun plan` adds up) says: after a forward
// and both backward ops of one convolution, the shared pools hold exactly its need. bf16 runs it in NCHW
// (oneDNN's forward and input gradient) and in nChw16c (Winograd's), once with flowrun's own bf16 kernels
// and once with oneDNN's alone (`own`, cpu::set_own_bf16_convs). In a process of its own (the
// threadsafe death-test style runs the test alone in a fresh one): the pools keep what earlier tests'
// convolutions grew them to, and a scratchpad's size is not monotone in the convolution's.
bool held_is_predicted(DType t, bool own = false) {
  cpu::set_own_bf16_convs(own);
  const Shape x = {16, 64, 64, 64}, w = {64, 64, 3, 3};
  auto ops = three_ops(x, w);
  if (t == DType::f32) {  // 16 channels: the forward pass and input gradient are cpu/conv_direct_f32.cc's
    for (auto& op : three_ops({16, 16, 32, 32}, {16, 16, 3, 3})) ops.push_back(op);
    // and at stride 2 the weight gradient, whose dy copy is a quarter of x's plane
    for (auto& op :
         three_ops({16, 32, 64, 64}, {64, 32, 3, 3}, {{"padding", Shape{1, 1}}, {"stride", Shape{2, 2}}}))
      ops.push_back(op);
    // and in nChw8c, which AVX-512's 16-channel kernels read through copies (larger planes: the largest)
    for (auto& op :
         three_ops({16, 16, 48, 48}, {16, 16, 3, 3},
                   {{"padding", Shape{1, 1}}, {"x_blocked", true}, {"y_blocked", true}, {"nchw8c", true}}))
      ops.push_back(op);
  }
  if (t == DType::bf16) {
    for (auto& op : three_ops(x, w, {{"padding", Shape{1, 1}}, {"x_blocked", true}, {"y_blocked", true}}))
      ops.push_back(op);
    // A ViT's patch embedding, whose weight gradient runs in f32 on widened copies.
    for (auto& op : three_ops({16, 1, 28, 28}, {96, 1, 7, 7}, {{"stride", Shape{7, 7}}})) ops.push_back(op);
  }
  std::map<std::string, size_t> pools;
  for (const auto& [op, spec] : ops) {
    single_op(op, spec.first, spec.second, t)->run();
    const OpDef& def = OpRegistry::get().at(op);
    std::vector<TensorType> in;
    for (const Arg& arg : spec.first) in.push_back({arg.shape, t});
    const std::vector<TensorType> out = def.infer(in, spec.second);
    for (const auto& [pool, bytes] :
         host_buffers(select_kernel(def, DeviceKind::cpu, t), in, out, spec.second))
      pools[pool] = std::max(pools[pool], bytes);
  }
  size_t predicted = 0;
  for (const auto& [pool, bytes] : pools) predicted += bytes;
  std::fprintf(stderr, "held %zu bytes, predicted %zu\n", cpu::dnnl_conv2d_held_bytes(), predicted);
  return predicted > 0 && cpu::dnnl_conv2d_held_bytes() == predicted;
}

TEST(ConvF32, HostBuffersPredictWhatTheKernelsHold) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(std::exit(held_is_predicted(DType::f32) ? 0 : 1), ::testing::ExitedWithCode(0),
              "held [0-9]+ bytes");
}

TEST(ConvBf16, HostBuffersPredictWhatTheKernelsHold) {
  const KernelChoice k = select_kernel(OpRegistry::get().at("conv2d"), DeviceKind::cpu, DType::bf16);
  if (!k.kernel || k.widened) GTEST_SKIP() << "no native bf16 convolutions on this machine";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (const bool own : {true, false}) {
    SCOPED_TRACE(own ? "own kernels" : "oneDNN's");
    EXPECT_EXIT(std::exit(held_is_predicted(DType::bf16, own) ? 0 : 1), ::testing::ExitedWithCode(0),
                "held [0-9]+ bytes");
  }
}

// The bf16 weight gradient of a ViT's patch embedding (one channel, 7x7 kernels at stride 7, NCHW) runs
// oneDNN's f32 kernel on widened copies of dy and x: exactly the f32 kernel's gradient of the same values,
// rounded.
TEST(ConvBf16, FewChannelWeightGradientIsTheF32OneRounded) {
  const KernelChoice k =
      select_kernel(OpRegistry::get().at("conv2d_grad_weight"), DeviceKind::cpu, DType::bf16);
  if (!k.kernel || k.widened) GTEST_SKIP() << "no native bf16 convolutions on this machine";
  const Attrs a{{"stride", Shape{7, 7}}, {"w_shape", Shape{96, 1, 7, 7}}};
  const std::vector<Arg> args = {{"dy", {8, 96, 4, 4}}, {"x", {8, 1, 28, 28}}};
  auto lo = single_op("conv2d_grad_weight", args, a, DType::bf16);
  auto hi = single_op("conv2d_grad_weight", args, a, DType::f32);
  for (const Arg& arg : args) hi->tensor(arg.name).fill_from(lo->tensor(arg.name).to_f64());
  lo->run();
  hi->run();
  const Tensor got = lo->output("out"), want = hi->output("out");
  ASSERT_EQ(got.dtype(), DType::bf16);
  for (int64_t i = 0; i < got.numel(); ++i)
    ASSERT_EQ(got.data<bf16>()[i].bits, float_to_bf16(want.data<float>()[i]).bits) << i;
}

}  // namespace
}  // namespace flowrun::testing
