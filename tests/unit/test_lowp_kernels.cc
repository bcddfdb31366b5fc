// Low-precision kernels: the vectorised f32 <-> bf16/f16 conversions against core/dtype.h's scalar
// reference, and each native bf16 kernel against the f32 kernel run widened (inputs widened, outputs
// rounded).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/tensor.h"
#include "op_harness.h"
#include "ops/cpu/attention.h"
#include "ops/cpu/conv_wgrad_bf16.h"
#include "ops/cpu/conv_wino_bf16.h"
#include "ops/cpu/dnnl_conv.h"
#include "ops/cpu/dnnl_matmul.h"
#include "ops/cpu/elementwise.h"
#include "ops/cpu/simd16.h"
#include "ops/registry.h"

namespace flowrun::testing {
namespace {

// f32 bit patterns covering every class: all 2^16 sign/exponent/high-mantissa prefixes (zeros, subnormals,
// normals, max, inf, NaNs) times low halves that hit each rounding case of bf16 (bit 16) and f16 (bit 13):
// exact, just below, at and above a tie, with even and odd kept mantissas.
std::vector<float> all_classes() {
  std::vector<uint32_t> low;
  for (uint32_t m3 = 0; m3 < 8; ++m3)
    for (uint32_t t : {0x0u, 0x1u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu}) low.push_back(m3 << 13 | t);
  for (uint32_t t : {0x7fffu, 0x8000u, 0x8001u, 0xffffu}) low.push_back(t);
  std::vector<float> v;
  v.reserve(low.size() << 16);
  for (uint32_t hi = 0; hi < (1u << 16); ++hi)
    for (uint32_t lo : low) v.push_back(bits_f32(hi << 16 | lo));
  return v;
}

TEST(LowpConvert, Float32ToBfloat16MatchesScalar) {
  const std::vector<float> x = all_classes();
  std::vector<bf16> y(x.size());
  cpu::convert(x.data(), DType::f32, y.data(), DType::bf16, static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(y[i].bits, float_to_bf16(x[i]).bits) << std::hex << "input bits 0x" << f32_bits(x[i]);
}

#if defined(__AVX512F__)
// The AVX-512 kernels' bf16 store (GELU, max pooling): vectors of one class each (all_classes holds 52
// values per prefix) and mixed ones, so that with avx512_bf16 both vcvtneps2bf16 and the denormal path run;
// a masked store leaves the lanes past the mask alone.
TEST(LowpConvert, Simd16StoreMatchesScalar) {
  std::vector<float> x = all_classes();
  for (const size_t shift : {size_t{0}, size_t{7}}) {
    SCOPED_TRACE(shift);
    std::vector<bf16> y(x.size());
    for (size_t i = shift; i + 16 <= x.size(); i += 16)
      cpu::simd16::store(y.data() + i, cpu::simd16::load(x.data() + i));
    for (size_t i = shift; i + 16 <= x.size(); ++i)
      ASSERT_EQ(y[i].bits, float_to_bf16(x[i]).bits) << std::hex << "input bits 0x" << f32_bits(x[i]);
  }
  std::vector<bf16> y(16, bf16{0x1234});
  cpu::simd16::store(y.data(), cpu::simd16::load(x.data()), 0x1f);
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(y[i].bits, i < 5 ? float_to_bf16(x[i]).bits : 0x1234) << i;
#if defined(__AVX512BF16__)
  // 32 at a time as even and odd lanes (the bf16 elementwise kernels' path): every class, denormals among
  // them, rounded as store rounds it and put back in place; and load_pairs gives back what was stored.
  std::vector<bf16> z(x.size() / 32 * 32);
  for (size_t i = 0; i < z.size(); i += 32) {
    const __m512 even =
        _mm512_set_ps(x[i + 30], x[i + 28], x[i + 26], x[i + 24], x[i + 22], x[i + 20], x[i + 18], x[i + 16],
                      x[i + 14], x[i + 12], x[i + 10], x[i + 8], x[i + 6], x[i + 4], x[i + 2], x[i]);
    const __m512 odd =
        _mm512_set_ps(x[i + 31], x[i + 29], x[i + 27], x[i + 25], x[i + 23], x[i + 21], x[i + 19], x[i + 17],
                      x[i + 15], x[i + 13], x[i + 11], x[i + 9], x[i + 7], x[i + 5], x[i + 3], x[i + 1]);
    cpu::simd16::store_pairs(z.data() + i, even, odd);
  }
  for (size_t i = 0; i < z.size(); ++i)
    ASSERT_EQ(z[i].bits, float_to_bf16(x[i]).bits) << std::hex << "input bits 0x" << f32_bits(x[i]);
  for (size_t i = 0; i < z.size(); i += 32) {
    __m512 even, odd;
    cpu::simd16::load_pairs(z.data() + i, even, odd);
    alignas(64) float e[16], o[16];
    _mm512_store_ps(e, even);
    _mm512_store_ps(o, odd);
    for (size_t k = 0; k < 16; ++k) {
      ASSERT_EQ(f32_bits(e[k]), f32_bits(bf16_to_float(z[i + 2 * k])));
      ASSERT_EQ(f32_bits(o[k]), f32_bits(bf16_to_float(z[i + 2 * k + 1])));
    }
  }
#endif
}
#endif

TEST(LowpConvert, Float32ToFloat16MatchesScalar) {
  const std::vector<float> x = all_classes();
  std::vector<f16> y(x.size());
  cpu::convert(x.data(), DType::f32, y.data(), DType::f16, static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(y[i].bits, float_to_f16(x[i]).bits) << std::hex << "input bits 0x" << f32_bits(x[i]);
}

TEST(LowpConvert, EveryLowPrecisionValueWidensExactly) {
  std::vector<uint16_t> h(1 << 16);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(i);
  std::vector<float> a(h.size()), b(h.size());
  cpu::convert(h.data(), DType::bf16, a.data(), DType::f32, static_cast<int64_t>(h.size()));
  cpu::convert(h.data(), DType::f16, b.data(), DType::f32, static_cast<int64_t>(h.size()));
  for (size_t i = 0; i < h.size(); ++i) {
    ASSERT_EQ(f32_bits(a[i]), f32_bits(bf16_to_float(bf16{h[i]}))) << "bf16 0x" << std::hex << i;
    ASSERT_EQ(f32_bits(b[i]), f32_bits(f16_to_float(f16{h[i]}))) << "f16 0x" << std::hex << i;
  }
}

// Values on the bf16 grid in [-4, 4] (GELU's interesting range), deterministic.
Tensor bf16_input(const Shape& s, uint64_t seed) {
  Tensor t = Tensor::empty(s, DType::bf16);
  const RngStream r{seed, 3};
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<bf16>()[i] = float_to_bf16(static_cast<float>(8.0 * r.uniform(static_cast<uint64_t>(i)) - 4.0));
  return t;
}

// The native bf16 kernel of `op` must equal its f32 kernel on the widened inputs, rounded once per bf16
// output: both compute in f32 in the same order. f32 inputs (a mixed kernel's parameters and statistics,
// KernelDef::f32_inputs) go to both as they are; f32 outputs and the inputs updated in place must be equal.
void expect_native_matches_widened(const std::string& op, const Attrs& attrs, const std::vector<Tensor>& in) {
  const OpDef& def = OpRegistry::get().at(op);
  const KernelChoice native = select_kernel(def, DeviceKind::cpu, DType::bf16);
  ASSERT_TRUE(native.kernel && !native.widened) << op << " has no native bf16 kernel";
  std::vector<Tensor> wide;  // bf16 inputs widened; f32 ones and integers (indices) as they are
  for (const Tensor& t : in) wide.push_back(t.dtype() == DType::bf16 ? t.to(DType::f32) : t.clone());
  const std::vector<Tensor> got = run_kernel(def, *native.kernel, attrs, in);
  const std::vector<Tensor> want = run_kernel(def, *def.kernel(DeviceKind::cpu, DType::f32), attrs, wide);
  ASSERT_EQ(got.size(), want.size());
  auto expect_equal = [&](const Tensor& g, const Tensor& w, const std::string& what) {
    ASSERT_EQ(g.shape(), w.shape());
    if (!is_floating(g.dtype())) {
      ASSERT_EQ(std::memcmp(g.raw(), w.raw(), g.nbytes()), 0) << op << " " << what;
      return;
    }
    for (int64_t e = 0; e < g.numel(); ++e) {
      const float x = w.data<float>()[e];
      if (g.dtype() == DType::bf16)
        ASSERT_EQ(g.data<bf16>()[e].bits, float_to_bf16(x).bits)
            << op << " " << what << " [" << e << "] of " << x;
      else
        ASSERT_EQ(g.data<float>()[e], x) << op << " " << what << " [" << e << "]";
    }
  };
  for (size_t j = 0; j < got.size(); ++j) {
    if (is_floating(want[j].dtype())) {
      ASSERT_EQ(got[j].dtype(), j == 0 || native.kernel->f32_inputs.empty() ? DType::bf16 : DType::f32);
    }
    expect_equal(got[j], want[j], cat("output ", j));
  }
  for (int i : def.mutated_inputs(attrs, static_cast<int>(in.size())))
    expect_equal(in[static_cast<size_t>(i)], wide[static_cast<size_t>(i)],
                 cat("input ", i, " (updated in place)"));
}

// Large enough (24576 elements) for the multi-threaded paths.
const Shape kBig = {4, 64, 96};

TEST(LowpKernels, GeluAndGradientMatchWidenedFloat32) {
  for (const char* approx : {"none", "tanh"}) {
    SCOPED_TRACE(approx);
    const Attrs a{{"approximate", std::string(approx)}};
    expect_native_matches_widened("gelu", a, {bf16_input(kBig, 1)});
    expect_native_matches_widened("gelu_grad", a, {bf16_input(kBig, 2), bf16_input(kBig, 3)});
    // At 3 threads the ranges of these 60015 values start at odd indices (20005) and end mid-register; the
    // bits must not change.
    const int threads = omp_get_max_threads();
    omp_set_num_threads(3);
    const Shape odd = {3, 5, 4001};
    expect_native_matches_widened("gelu", a, {bf16_input(odd, 1)});
    expect_native_matches_widened("gelu_grad", a, {bf16_input(odd, 2), bf16_input(odd, 3)});
    omp_set_num_threads(threads);
  }
}

TEST(LowpKernels, ActivationGradientsMatchWidenedFloat32) {
  for (const char* op : {"relu_grad", "silu_grad", "tanh_grad", "sigmoid_grad"}) {
    SCOPED_TRACE(op);
    expect_native_matches_widened(op, {}, {bf16_input(kBig, 4), bf16_input(kBig, 5)});
  }
}

// Rotations of 24 pairs (a whole register and a masked one) and of 3, forwards and inverse at an offset,
// on 2 x 3 heads of 17 positions: the bf16 kernel's rows are the f32 kernel's, rounded.
TEST(LowpKernels, RopeMatchesWidenedFloat32) {
  for (const int64_t d : {48, 6}) {
    SCOPED_TRACE(d);
    expect_native_matches_widened("rope", {{"theta", 10000.0}}, {bf16_input({2, 3, 17, d}, 12)});
    expect_native_matches_widened("rope", {{"theta", 500000.0}, {"inverse", true}, {"offset", int64_t{40}}},
                                  {bf16_input({2, 3, 17, d}, 13)});
  }
}

TEST(LowpKernels, AddMatchesWidenedFloat32InEveryBroadcastCase) {
  expect_native_matches_widened("add", {}, {bf16_input(kBig, 6), bf16_input(kBig, 7)});  // same shape
  expect_native_matches_widened("add", {}, {bf16_input(kBig, 6), bf16_input({96}, 8)});  // bias
  expect_native_matches_widened("add", {}, {bf16_input({4, 1, 96}, 9), bf16_input({64, 1}, 10)});  // general
}

TEST(LowpKernels, ReduceSumMatchesWidenedFloat32) {
  // The bias gradient (all leading axes), a middle axis, two separate groups, everything.
  for (const std::vector<int64_t>& axes : std::vector<std::vector<int64_t>>{{0, 1}, {1}, {0, 2}, {}}) {
    SCOPED_TRACE(::testing::PrintToString(axes));
    expect_native_matches_widened("reduce_sum", Attrs{{"axes", axes}, {"keepdims", false}},
                                  {bf16_input(kBig, 11)});
    expect_native_matches_widened("reduce_mean", Attrs{{"axes", axes}, {"keepdims", true}},
                                  {bf16_input(kBig, 12)});
  }
}

// out_dtype f32 (graph/amp.cc fold_f32_casts): a bf16 matmul, linear or reduce_sum writes the f32 sum that
// its bf16 result rounds: rounded to bf16 it is that result, bit for bit (and reduce_sum's is the f32
// kernel's on the widened input). Matmuls: a plain product, a weight gradient (A transposed, K >= 2048:
// summed in chunks of K) and a batched one; a linear with its bias.
TEST(LowpKernels, F32ResultsAreTheSumsThatBf16ResultsRound) {
  auto check = [](const std::string& op, Attrs attrs, const std::vector<Tensor>& in) {
    SCOPED_TRACE(op);
    const OpDef& def = OpRegistry::get().at(op);
    const KernelChoice native = select_kernel(def, DeviceKind::cpu, DType::bf16);
    if (!native.kernel || native.widened) {
      // Below avx512_bf16 oneDNN has no bf16 products: they run widened, through the f32 kernels.
      ASSERT_FALSE(cpu::has_native_bf16()) << op << " has no native bf16 kernel";
      return;
    }
    const Tensor rounded = run_kernel(def, *native.kernel, attrs, in)[0];
    attrs.set("out_dtype", std::string("f32"));
    const Tensor wide = run_kernel(def, *native.kernel, attrs, in)[0];
    ASSERT_EQ(wide.dtype(), DType::f32);
    ASSERT_EQ(wide.shape(), rounded.shape());
    int64_t inexact = 0;  // elements the rounding changed: the f32 result is not a bf16 one in disguise
    for (int64_t e = 0; e < wide.numel(); ++e) {
      const float x = wide.data<float>()[e];
      ASSERT_EQ(float_to_bf16(x).bits, rounded.data<bf16>()[e].bits) << "[" << e << "] " << x;
      inexact += bf16_to_float(float_to_bf16(x)) != x;
    }
    EXPECT_GT(inexact, wide.numel() / 2);
  };
  check("matmul", {}, {bf16_input({64, 96}, 21), bf16_input({96, 80}, 22)});
  check("matmul", {{"trans_a", true}}, {bf16_input({2100, 48}, 23), bf16_input({2100, 40}, 24)});
  check("matmul", {}, {bf16_input({3, 20, 32}, 25), bf16_input({3, 32, 24}, 26)});
  check("linear", {}, {bf16_input({64, 96}, 27), bf16_input({80, 96}, 28), bf16_input({80}, 29)});
  check("reduce_sum", {{"axes", std::vector<int64_t>{0, 1}}, {"keepdims", false}}, {bf16_input(kBig, 30)});
  Attrs sum{{"axes", std::vector<int64_t>{0, 1}}, {"keepdims", false}};
  const OpDef& rs = OpRegistry::get().at("reduce_sum");
  const Tensor x = bf16_input(kBig, 31);
  const Tensor want = run_kernel(rs, *rs.kernel(DeviceKind::cpu, DType::f32), sum, {x.to(DType::f32)})[0];
  sum.set("out_dtype", std::string("f32"));
  const Tensor got = run_kernel(rs, *select_kernel(rs, DeviceKind::cpu, DType::bf16).kernel, sum, {x})[0];
  ASSERT_EQ(std::memcmp(got.raw(), want.raw(), got.nbytes()), 0);
}

// Parameters for the mixed-precision norms: f32, uniform in [lo, lo + 1).
Tensor f32_params(int64_t n, uint64_t seed, double lo) {
  Tensor t = Tensor::empty({n}, DType::f32);
  const RngStream r{seed, 5};
  for (int64_t i = 0; i < n; ++i)
    t.data<float>()[i] = static_cast<float>(lo + r.uniform(static_cast<uint64_t>(i)));
  return t;
}

// layernorm and rmsnorm on bf16 rows with f32 gamma and beta: statistics and parameter gradients bitwise the
// f32 kernel's on the widened input, y and dx its results rounded once. 70 columns run the vector loop and a
// tail; 200 rows are more than the 64 blocks of the parameter gradients' partial sums.
TEST(LowpKernels, RowNormsMatchWidenedFloat32WithFloat32Statistics) {
  for (const Shape& x : std::vector<Shape>{{200, 70}, {3, 5, 96}}) {
    SCOPED_TRACE(shape_str(x));
    const int64_t d = x.back();
    const Tensor xb = bf16_input(x, 30), dy = bf16_input(x, 31), g = f32_params(d, 32, 0.5),
                 beta = f32_params(d, 33, -0.5);
    for (const bool centered : {true, false}) {
      const std::string op = centered ? "layernorm" : "rmsnorm";
      SCOPED_TRACE(op);
      std::vector<Tensor> in = {xb, g};
      if (centered) in.push_back(beta);
      expect_native_matches_widened(op, {}, in);
      const OpDef& def = OpRegistry::get().at(op);
      std::vector<Tensor> wide = {xb.to(DType::f32), g};
      if (centered) wide.push_back(beta);
      const std::vector<Tensor> fwd = run_kernel(def, *def.kernel(DeviceKind::cpu, DType::f32), {}, wide);
      std::vector<Tensor> grad_in = {dy, xb, g};
      for (size_t j = 1; j < fwd.size(); ++j) grad_in.push_back(fwd[j]);  // mean and rstd, or rstd
      expect_native_matches_widened(op + "_grad", {}, grad_in);
    }
  }
}

// bf16 activations with f32 per-channel inputs: a training step's statistics, the running statistics it
// updates and the gradients are the f32 kernel's exactly (the sums run in f32 in the same order), y and dx
// its results rounded once. Plain (N, C) with more rows than the 64 row blocks, plain planes, nChw16c planes
// (attr blocked), and inference.
TEST(LowpKernels, BatchnormMatchesWidenedFloat32WithFloat32Statistics) {
  struct Case {
    Shape x;
    bool blocked, training;
  };
  for (const Case& k : std::vector<Case>{{{67, 48}, false, true},
                                         {{4, 32, 9, 11}, false, true},
                                         {{4, 32, 9, 11}, true, true},
                                         {{4, 32, 9, 11}, true, false},
                                         {{3, 5, 7}, false, false}}) {
    SCOPED_TRACE(cat(shape_str(k.x), k.blocked ? " blocked" : "", k.training ? " training" : " inference"));
    const int64_t c = k.x[1];
    const Attrs a{{"training", k.training}, {"blocked", k.blocked}};
    const Tensor x = bf16_input(k.x, 20);
    expect_native_matches_widened("batchnorm", a,
                                  {x, f32_params(c, 21, 0.5), f32_params(c, 22, -0.5),
                                   f32_params(c, 23, -0.5), f32_params(c, 24, 0.5)});
    // The statistics the forward pass saves, from the f32 kernel, for the gradient.
    const OpDef& bn = OpRegistry::get().at("batchnorm");
    Tensor rm = f32_params(c, 23, -0.5), rv = f32_params(c, 24, 0.5);
    const std::vector<Tensor> fwd =
        run_kernel(bn, *bn.kernel(DeviceKind::cpu, DType::f32), a,
                   {x.to(DType::f32), f32_params(c, 21, 0.5), f32_params(c, 22, -0.5), rm, rv});
    expect_native_matches_widened("batchnorm_grad", Attrs{{"training", k.training}, {"blocked", k.blocked}},
                                  {bf16_input(k.x, 25), x, f32_params(c, 21, 0.5), fwd[1], fwd[2]});
  }
}

// Max pooling in bf16 picks the f32 kernel's maxima and indices (a maximum is one of the inputs), plain and
// nChw16c (attr blocked), with and without its fused relu, with overlapping padded windows and the 2x2
// windows that tile a plane; NaNs and ties included (the bf16 grid of [-4, 4] ties often). Its gradient,
// where windows tile the plane, is the widened f32 kernel's exactly, relu mask (the pooled output) included.
TEST(LowpKernels, MaxPoolMatchesWidenedFloat32) {
  for (const bool blocked : {false, true}) {
    Tensor x = bf16_input({2, 16, 9, 8}, 40);
    x.data<bf16>()[5] = float_to_bf16(std::numeric_limits<float>::quiet_NaN());
    x.data<bf16>()[300] = float_to_bf16(std::numeric_limits<float>::quiet_NaN());
    for (const int64_t k : {2, 3})
      for (const bool relu : {false, true}) {
        SCOPED_TRACE(cat(blocked ? "blocked" : "plain", ", window ", k, relu ? ", relu" : ""));
        const Attrs a{{"kernel", k},
                      {"stride", int64_t{2}},
                      {"padding", int64_t{k - 2}},
                      {"blocked", blocked},
                      {"relu", relu}};
        expect_native_matches_widened("maxpool2d", a, {x});
      }
    SCOPED_TRACE(blocked ? "blocked gradient" : "plain gradient");
    const Tensor xt = bf16_input({2, 16, 8, 8}, 41);
    const Attrs a{{"kernel", int64_t{2}}, {"stride", int64_t{2}}, {"blocked", blocked}};
    const OpDef& mp = OpRegistry::get().at("maxpool2d");
    const std::vector<Tensor> fwd = run_kernel(mp, *mp.kernel(DeviceKind::cpu, DType::bf16), a, {xt});
    Attrs ga = a;
    ga.set("in_shape", std::vector<int64_t>{2, 16, 8, 8});
    const Tensor dy = bf16_input({2, 16, 4, 4}, 42);
    expect_native_matches_widened("maxpool2d_grad", ga, {dy, fwd[1]});
    expect_native_matches_widened("maxpool2d_grad", ga, {dy, fwd[1], fwd[0]});
  }
}

// Largest |got - want| over the largest |want|: bf16 outputs against the f32 kernel's.
double relative_error(const Tensor& got, const Tensor& want) {
  double err = 0, top = 0;
  for (int64_t e = 0; e < want.numel(); ++e) {
    const double w = want.data<float>()[e];
    const double g = got.dtype() == DType::bf16 ? bf16_to_float(got.data<bf16>()[e]) : got.data<float>()[e];
    err = std::max(err, std::abs(g - w));
    top = std::max(top, std::abs(w));
  }
  return err / top;
}

// Native bf16 attention rounds the probabilities P and dS to bf16 for the products that read them (as
// FlashAttention does), which the widened f32 kernel does not, so it agrees within bf16 rounding, not
// bitwise. Measured: out and dq/dk/dv within 0.25-0.52% of their largest magnitude (the bf16 rounding of the
// outputs alone is up to 0.4%), checked at 1%; a wrong
// block, pair or mask gives errors of order 1. It must not depend on the thread count.
struct AttentionCase {
  int64_t b, h, t, s, d, dv;
  bool causal, padded;
};

// op's native bf16 CPU kernel where this CPU can run it, whether or not programs choose it: on AMX hosts
// they run attention widened (cpu::bf16_attention_native), and the kernels are still tested there.
const KernelDef* bf16_kernel(const OpDef& def) {
#if defined(__AVX512BF16__)
  for (const KernelDef& k : def.kernels)
    if (k.device == DeviceKind::cpu && k.dtypes == std::vector<DType>{DType::bf16} && cpu::has_avx512_bf16())
      return &k;
#else
  (void)def;
#endif
  return nullptr;
}

void expect_native_attention_close(const AttentionCase& ac) {
  const OpDef &fwd = OpRegistry::get().at("sdpa"), &bwd = OpRegistry::get().at("sdpa_grad");
  const KernelDef *native = bf16_kernel(fwd), *native_grad = bf16_kernel(bwd);
  if (!native) GTEST_SKIP() << "no avx512_bf16 attention on this machine";
  ASSERT_TRUE(native_grad);
#if defined(__AVX512BF16__)
  EXPECT_EQ(select_kernel(fwd, DeviceKind::cpu, DType::bf16).widened, !cpu::bf16_attention_native());
#endif
  Attrs a{{"causal", ac.causal}};
  std::vector<Tensor> in = {bf16_input({ac.b, ac.h, ac.t, ac.d}, 21),
                            bf16_input({ac.b, ac.h, ac.s, ac.d}, 22),
                            bf16_input({ac.b, ac.h, ac.s, ac.dv}, 23)};
  if (ac.padded) {
    a.set("pad_id", int64_t{0});
    Tensor ids = Tensor::empty({ac.b, ac.s}, DType::i64);
    for (int64_t e = 0; e < ids.numel(); ++e) ids.data<int64_t>()[e] = e % 5 == 1 ? 0 : 1 + e % 7;
    in.push_back(ids);
  }
  auto widen = [](const std::vector<Tensor>& ts) {
    std::vector<Tensor> w;
    for (const Tensor& t : ts) w.push_back(t.dtype() == DType::bf16 ? t.to(DType::f32) : t);
    return w;
  };
  const KernelDef& f32 = *fwd.kernel(DeviceKind::cpu, DType::f32);
  const KernelDef& f32_grad = *bwd.kernel(DeviceKind::cpu, DType::f32);
  const std::vector<Tensor> got = run_kernel(fwd, *native, a, in);
  const std::vector<Tensor> want = run_kernel(fwd, f32, a, widen(in));
  EXPECT_LT(relative_error(got[0], want[0]), 1e-2) << "out";
  for (int64_t e = 0; e < want[1].numel(); ++e)
    ASSERT_NEAR(got[1].data<float>()[e], want[1].data<float>()[e], 1e-2) << "lse [" << e << "]";

  const Tensor dout = bf16_input({ac.b, ac.h, ac.t, ac.dv}, 24);
  std::vector<Tensor> gin = {dout, in[0], in[1], in[2], got[0], got[1]};
  std::vector<Tensor> win = widen({dout, in[0], in[1], in[2], want[0].to(DType::bf16), want[1]});
  if (ac.padded) {
    gin.push_back(in[3]);
    win.push_back(in[3]);
  }
  const std::vector<Tensor> grads = run_kernel(bwd, *native_grad, a, gin);
  const std::vector<Tensor> wgrads = run_kernel(bwd, f32_grad, a, win);
  for (size_t j = 0; j < 3; ++j) EXPECT_LT(relative_error(grads[j], wgrads[j]), 1e-2) << "gradient " << j;

  // Bitwise the same at another thread count.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(3);
  const std::vector<Tensor> got3 = run_kernel(fwd, *native, a, in);
  const std::vector<Tensor> grads3 = run_kernel(bwd, *native_grad, a, gin);
  omp_set_num_threads(threads);
  for (size_t j = 0; j < 2; ++j)
    EXPECT_EQ(std::memcmp(got3[j].raw(), got[j].raw(), got[j].nbytes()), 0) << "output " << j;
  for (size_t j = 0; j < 3; ++j)
    EXPECT_EQ(std::memcmp(grads3[j].raw(), grads[j].raw(), grads[j].nbytes()), 0) << "gradient " << j;
}

TEST(LowpKernels, AttentionMatchesWidenedFloat32WithinBfloat16Rounding) {
  // GPT's shape; odd lengths and head dims (padded pairs, partial blocks, masked columns); a last block of 50
  // columns (four registers, one masked) under a causal mask with more keys than queries; more keys than
  // queries without the mask; padded keys.
  for (const AttentionCase& ac :
       {AttentionCase{2, 3, 128, 128, 64, 64, true, false}, AttentionCase{1, 2, 70, 100, 33, 17, true, false},
        AttentionCase{2, 1, 65, 130, 32, 48, false, false},
        AttentionCase{1, 2, 100, 150, 24, 50, true, false},
        AttentionCase{2, 2, 77, 77, 24, 24, true, true}}) {
    SCOPED_TRACE(::testing::Message() << "T " << ac.t << " S " << ac.s << " D " << ac.d << " Dv " << ac.dv
                                      << (ac.causal ? " causal" : "") << (ac.padded ? " padded" : ""));
    expect_native_attention_close(ac);
  }
}

// A bf16 tensor (N, C, H, W) from NCHW into nChw16c, or back: the reorder op's kernel, which the registry's
// samples check against its scalar reference.
Tensor relayout(const Tensor& t, bool to_blocked) {
  const OpDef& def = OpRegistry::get().at("reorder");
  return run_kernel(def, *def.kernel(DeviceKind::cpu, DType::bf16),
                    {{"to", std::string(to_blocked ? "nchw16c" : "nchw")}}, {t})[0];
}
Tensor nchw16c(const Tensor& t) {
  return relayout(t, true);
}

// Runs bf16 3x3 convolutions through flowrun's own kernels (`on`) or oneDNN's for its lifetime, so that both
// paths are checked on any machine that has native bf16, whichever of them its runs use.
class OwnBf16Convs {
 public:
  explicit OwnBf16Convs(bool on) : saved_(cpu::own_bf16_convs()) { cpu::set_own_bf16_convs(on); }
  ~OwnBf16Convs() { cpu::set_own_bf16_convs(saved_); }
  OwnBf16Convs(const OwnBf16Convs&) = delete;
  OwnBf16Convs& operator=(const OwnBf16Convs&) = delete;

 private:
  bool saved_;
};

// conv2d_grad_weight in bf16 against f64 on the same (widened) inputs: within the output's bf16 rounding plus
// the f32 sums' error (1e-4 of the sum of the terms' magnitudes; a wrong tap, shift or pair is off by the
// order of that sum). The 3x3 stride-1 kernel (wgrad3x3_bf16, where Winograd's does not serve: odd heights
// here) must also give the same bits from NCHW and nChw16c inputs and at any thread count. Batches of one and
// of two partials, an odd channel count, widths whose column pairs end mid-register (9, 17 pairs) and a row
// of 34 (two and a bit 16-pixel tiles); an odd width and a stride of 2 run through oneDNN. All of it once more
// with oneDNN's kernels for every case (its fixed batch blocks give the same bits at any thread count too).
void conv_weight_gradient_matches_float64() {
  struct Case {
    Shape x;
    int64_t o, stride;
  };
  const OpDef& def = OpRegistry::get().at("conv2d_grad_weight");
  const KernelChoice native = select_kernel(def, DeviceKind::cpu, DType::bf16);
  const KernelDef& f64 = *def.kernel(DeviceKind::cpu, DType::f64);
  for (const Case& k :
       {Case{{8, 16, 7, 10}, 16, 1}, Case{{17, 3, 6, 6}, 16, 1}, Case{{16, 32, 5, 18}, 32, 1},
        Case{{8, 16, 5, 34}, 16, 1}, Case{{8, 16, 7, 7}, 16, 1}, Case{{8, 16, 8, 8}, 32, 2}}) {
    SCOPED_TRACE(::testing::Message() << shape_str(k.x) << " -> " << k.o << " stride " << k.stride);
    const Shape ws = {k.o, k.x[1], 3, 3};
    Attrs a{{"padding", Shape{1, 1}}, {"stride", Shape{k.stride, k.stride}}, {"w_shape", ws}};
    const Shape ys = OpRegistry::get().at("conv2d").infer({{k.x, DType::f32}, {ws, DType::f32}}, a)[0].shape;
    const Tensor dy = bf16_input(ys, 31), x = bf16_input(k.x, 32);
    const Tensor got = run_kernel(def, *native.kernel, a, {dy, x})[0];
    const Tensor want = run_kernel(def, f64, a, {dy.to(DType::f64), x.to(DType::f64)})[0];
    Tensor ady = dy.to(DType::f64), ax = x.to(DType::f64);
    for (Tensor* t : {&ady, &ax})
      for (int64_t e = 0; e < t->numel(); ++e) t->data<double>()[e] = std::abs(t->data<double>()[e]);
    const Tensor magnitude = run_kernel(def, f64, a, {ady, ax})[0];
    for (int64_t e = 0; e < want.numel(); ++e) {
      const double w = want.data<double>()[e], g = bf16_to_float(got.data<bf16>()[e]);
      ASSERT_LE(std::abs(g - w), std::ldexp(std::abs(w), -8) + 1e-4 * magnitude.data<double>()[e])
          << "[" << e << "] of " << w;
    }
    cpu::ConvGeom g = cpu::conv_geom(k.x, ws, a);
    ASSERT_FALSE(cpu::wino3x3_bf16_serves(g)) << "a case for ConvWinogradMatchesFloat64WithinItsRounding";
    if (!cpu::wgrad3x3_bf16_serves(g)) continue;
    auto expect_same = [&](const Tensor& other, const std::string& what) {
      EXPECT_EQ(std::memcmp(other.raw(), got.raw(), got.nbytes()), 0) << what;
    };
    const int threads = omp_get_max_threads();
    omp_set_num_threads(3);
    expect_same(run_kernel(def, *native.kernel, a, {dy, x})[0], "3 threads");
    omp_set_num_threads(threads);
    if (k.o % 16 == 0) {
      Attrs b = a;
      b.set("y_blocked", true);
      expect_same(run_kernel(def, *native.kernel, b, {nchw16c(dy), x})[0], "dy blocked");
      if (k.x[1] % 16 == 0) {
        b.set("x_blocked", true);
        expect_same(run_kernel(def, *native.kernel, b, {nchw16c(dy), nchw16c(x)})[0], "dy and x blocked");
      }
    }
  }
}

// Weight-gradient products (A transposed, K the batch's rows) give the same bits at 1, 2, 3 and 6 threads, in
// f32 and bf16 (y in f32 or bf16): oneDNN would split their K sums by a plan made for the thread count, on
// AMX even for K = 1024 (dnnl_matmul.cc cuts these products into fixed tiles or K chunks). Outputs with edge
// tiles and long K sums of several chunks.
TEST(LowpKernels, WeightGradientProductsDoNotDependOnTheThreadCount) {
  struct Case {
    int64_t m, n, k;
    DType dtype, ytype;
  };
  const int threads = omp_get_max_threads();
  for (const Case& c : {Case{256, 256, 1024, DType::bf16, DType::f32}, Case{200, 130, 3000, DType::bf16, DType::bf16},
                        Case{256, 768, 2048, DType::bf16, DType::f32}, Case{256, 768, 2048, DType::f32, DType::f32},
                        Case{130, 200, 3000, DType::f32, DType::f32}}) {
    if (c.dtype == DType::bf16 && !cpu::has_native_bf16()) continue;
    SCOPED_TRACE(::testing::Message() << c.m << " x " << c.n << " x " << c.k << " " << dtype_name(c.dtype) << " -> "
                                      << dtype_name(c.ytype));
    const Tensor a = bf16_input({c.k, c.m}, 5).to(c.dtype), b = bf16_input({c.k, c.n}, 6).to(c.dtype);
    const size_t bytes = static_cast<size_t>(c.m * c.n) * dtype_size(c.ytype);
    std::vector<char> want(bytes), got(bytes);
    omp_set_num_threads(1);
    cpu::dnnl_matmul(c.dtype, c.ytype, 1, c.m, c.n, c.k, true, false, 0, 0, 1.0f, 0.0f, a.raw(), b.raw(),
                     want.data());
    for (const int t : {2, 3, 6}) {
      omp_set_num_threads(t);
      cpu::dnnl_matmul(c.dtype, c.ytype, 1, c.m, c.n, c.k, true, false, 0, 0, 1.0f, 0.0f, a.raw(), b.raw(),
                       got.data());
      EXPECT_EQ(std::memcmp(want.data(), got.data(), bytes), 0) << t << " threads";
    }
  }
  omp_set_num_threads(threads);
}

TEST(LowpKernels, ConvWeightGradientMatchesFloat64WithinBfloat16Rounding) {
  const KernelChoice native =
      select_kernel(OpRegistry::get().at("conv2d_grad_weight"), DeviceKind::cpu, DType::bf16);
  if (!native.kernel || native.widened) GTEST_SKIP() << "no native bf16 convolutions on this machine";
  for (const bool own : {true, false}) {
    SCOPED_TRACE(own ? "own kernels" : "oneDNN's");
    const OwnBf16Convs use(own);
    conv_weight_gradient_matches_float64();
  }
}

Tensor nchw_of(const Tensor& b) {
  return relayout(b, false);
}

// Integers in [-2, 2] (`small`) or the bf16 grid in [-4, 4].
Tensor bf16_values(const Shape& s, uint64_t seed, bool small) {
  if (!small) return bf16_input(s, seed);
  Tensor t = Tensor::empty(s, DType::bf16);
  const RngStream r{seed, 7};
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<bf16>()[i] =
        float_to_bf16(static_cast<float>(std::floor(5.0 * r.uniform(static_cast<uint64_t>(i))) - 2.0));
  return t;
}

// Per output of the 3x3, padding-1 convolution of x (n, ci, h, w) with filters f (co, ci, 3, 3), both
// float64: sum over ci and the 16 positions p of |A|_p (|B^T| |d| |B|)_p (|G| |f| |G^T|)_p, which bounds the
// transformed values whose bf16 rounding F(2x2, 3x3)'s output carries.
std::vector<double> winograd_magnitudes(const Tensor& x, const Tensor& f) {
  const Shape& xs = x.shape();
  const int64_t n = xs[0], ci = xs[1], h = xs[2], w = xs[3], co = f.shape()[0];
  const double bt[4][4] = {{1, 0, 1, 0}, {0, 1, 1, 0}, {0, 1, 1, 0}, {0, 1, 0, 1}};
  const double gm[4][3] = {{1, 0, 0}, {.5, .5, .5}, {.5, .5, .5}, {0, 0, 1}};
  const double at[2][4] = {{1, 1, 1, 0}, {0, 1, 1, 1}};
  const double* xd = x.data<double>();
  const double* fd = f.data<double>();
  std::vector<double> out(static_cast<size_t>(n * co * h * w), 0.0);
  std::vector<double> v(static_cast<size_t>(co * ci * 16));
  for (int64_t o = 0; o < co; ++o)
    for (int64_t c = 0; c < ci; ++c)
      for (int a = 0; a < 4; ++a)
        for (int b = 0; b < 4; ++b) {
          double s = 0;
          for (int i = 0; i < 3; ++i)
            for (int j = 0; j < 3; ++j)
              s += gm[a][i] * std::abs(fd[((o * ci + c) * 3 + i) * 3 + j]) * gm[b][j];
          v[static_cast<size_t>((o * ci + c) * 16 + a * 4 + b)] = s;
        }
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ty = 0; ty < h / 2; ++ty)
      for (int64_t tx = 0; tx < w / 2; ++tx)
        for (int64_t c = 0; c < ci; ++c) {
          double d[4][4], u[16];
          for (int i = 0; i < 4; ++i)
            for (int j = 0; j < 4; ++j) {
              const int64_t yy = 2 * ty - 1 + i, xx = 2 * tx - 1 + j;
              d[i][j] =
                  yy < 0 || yy >= h || xx < 0 || xx >= w ? 0 : std::abs(xd[((b * ci + c) * h + yy) * w + xx]);
            }
          for (int a = 0; a < 4; ++a)
            for (int e = 0; e < 4; ++e) {
              double s = 0;
              for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) s += bt[a][i] * d[i][j] * bt[e][j];
              u[a * 4 + e] = s;
            }
          for (int64_t o = 0; o < co; ++o)
            for (int i = 0; i < 2; ++i)
              for (int j = 0; j < 2; ++j) {
                double s = 0;
                for (int p = 0; p < 16; ++p)
                  s += at[i][p / 4] * at[j][p % 4] * u[p] * v[static_cast<size_t>((o * ci + c) * 16 + p)];
                out[static_cast<size_t>(((b * co + o) * h + 2 * ty + i) * w + 2 * tx + j)] += s;
              }
        }
  return out;
}

// Per weight (o, c, kh, kw) of the 3x3, padding-1 convolution's weight gradient from x (n, c, h, w) and dy
// (n, o, h, w), float64: sum over images, 2x2 tiles and the 16 positions p of |G^T|_p (|B^T| |x| |B|)_p
// (|A| |dy| |A^T|)_p, which bounds the transformed values whose bf16 rounding the Winograd gradient carries.
std::vector<double> winograd_weight_magnitudes(const Tensor& x, const Tensor& dy) {
  const Shape& xs = x.shape();
  const int64_t n = xs[0], ci = xs[1], h = xs[2], w = xs[3], co = dy.shape()[1];
  const double bt[4][4] = {{1, 0, 1, 0}, {0, 1, 1, 0}, {0, 1, 1, 0}, {0, 1, 0, 1}};
  const double am[4][2] = {{1, 0}, {1, 1}, {1, 1}, {0, 1}};
  const double gt[3][4] = {{1, .5, .5, 0}, {0, .5, .5, 0}, {0, .5, .5, 1}};
  const double* xd = x.data<double>();
  const double* yd = dy.data<double>();
  std::vector<double> out(static_cast<size_t>(co * ci * 9), 0.0), u(static_cast<size_t>(ci * 16)),
      v(static_cast<size_t>(co * 16));
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ty = 0; ty < h / 2; ++ty)
      for (int64_t tx = 0; tx < w / 2; ++tx) {
        for (int64_t c = 0; c < ci; ++c)
          for (int a = 0; a < 4; ++a)
            for (int e = 0; e < 4; ++e) {
              double sum = 0;
              for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) {
                  const int64_t yy = 2 * ty - 1 + i, xx = 2 * tx - 1 + j;
                  if (yy >= 0 && yy < h && xx >= 0 && xx < w)
                    sum += bt[a][i] * std::abs(xd[((b * ci + c) * h + yy) * w + xx]) * bt[e][j];
                }
              u[static_cast<size_t>(c * 16 + a * 4 + e)] = sum;
            }
        for (int64_t o = 0; o < co; ++o)
          for (int a = 0; a < 4; ++a)
            for (int e = 0; e < 4; ++e) {
              double sum = 0;
              for (int i = 0; i < 2; ++i)
                for (int j = 0; j < 2; ++j)
                  sum += am[a][i] * std::abs(yd[((b * co + o) * h + 2 * ty + i) * w + 2 * tx + j]) * am[e][j];
              v[static_cast<size_t>(o * 16 + a * 4 + e)] = sum;
            }
        for (int64_t o = 0; o < co; ++o)
          for (int64_t c = 0; c < ci; ++c)
            for (int k = 0; k < 3; ++k)
              for (int l = 0; l < 3; ++l) {
                double sum = 0;
                for (int p = 0; p < 16; ++p)
                  sum += gt[k][p / 4] * gt[l][p % 4] * u[static_cast<size_t>(c * 16 + p)] *
                         v[static_cast<size_t>(o * 16 + p)];
                out[static_cast<size_t>(((o * ci + c) * 3 + k) * 3 + l)] += sum;
              }
      }
  return out;
}

// The bf16 3x3 convolution (with and without a bias), its input gradient and its weight gradient in nChw16c,
// where wino3x3_bf16 serves
// them (Winograd's F(2x2, 3x3), and F(3x3, 2x2) for the weights, on vdpbf16ps products), against the float64
// kernels on the same inputs:
//  - on integers in [-2, 2] every transformed value is exact in bf16 (sums of a few small integers, halves
//    and quarters of them), so the result must be the float64 one rounded once: a wrong tap, tile or
//    channel is caught;
//  - on the bf16 grid in [-4, 4], within the output's rounding plus 2^-8 (the two transformed operands'
//    roundings, 2^-9 each) of winograd_magnitudes or winograd_weight_magnitudes.
// And the same bits at 3 threads and from NCHW activations. Channels in and out unequal, planes of one tile,
// odd tile counts, tile rows that do not divide the items' 16 tiles, a last item part full, 48 channels
// (three channel blocks), and a batch of 17 (two weight-gradient partials).
TEST(LowpKernels, ConvWinogradMatchesFloat64WithinItsRounding) {
  struct Case {
    Shape x;
    int64_t o;
  };
  const KernelChoice native = select_kernel(OpRegistry::get().at("conv2d"), DeviceKind::cpu, DType::bf16);
  if (!native.kernel || native.widened) GTEST_SKIP() << "no native bf16 convolutions on this machine";
  const OwnBf16Convs use(true);
  for (const Case& k : {Case{{2, 16, 8, 8}, 32}, Case{{3, 32, 6, 10}, 16}, Case{{1, 16, 2, 2}, 16},
                        Case{{2, 48, 4, 34}, 16}, Case{{2, 16, 16, 16}, 64}, Case{{17, 16, 4, 6}, 16}}) {
    const Shape ws = {k.o, k.x[1], 3, 3}, ys = {k.x[0], k.o, k.x[2], k.x[3]};
    const Attrs a{{"padding", Shape{1, 1}}, {"x_blocked", true}, {"y_blocked", true}};
    ASSERT_TRUE(cpu::wino3x3_bf16_serves(cpu::conv_geom(k.x, ws, a)));
    for (const char* op : {"conv2d", "conv2d+bias", "conv2d_grad_input", "conv2d_grad_weight"})
      for (const bool small : {true, false}) {
        SCOPED_TRACE(::testing::Message() << shape_str(k.x) << " -> " << k.o << " " << op
                                          << (small ? ", integers" : ", bf16 grid"));
        const bool bias = std::string(op) == "conv2d+bias";
        const std::string name = bias ? "conv2d" : op;
        const OpDef& def = OpRegistry::get().at(name);
        const KernelDef& kern = *select_kernel(def, DeviceKind::cpu, DType::bf16).kernel;
        const KernelDef& f64 = *def.kernel(DeviceKind::cpu, DType::f64);
        Attrs b = a;
        // Inputs in NCHW (the float64 kernel's) and the blocked ones the bf16 kernel reads; its output
        // back in NCHW.
        std::vector<Tensor> in, blocked;
        std::vector<double> mag;
        if (name == "conv2d_grad_weight") {
          b.set("w_shape", ws);
          in = {bf16_values(ys, 41, small), bf16_values(k.x, 42, small)};
          blocked = {nchw16c(in[0]), nchw16c(in[1])};
          mag = winograd_weight_magnitudes(in[1].to(DType::f64), in[0].to(DType::f64));
        } else {
          const bool grad = name == "conv2d_grad_input";
          if (grad) b.set("in_shape", k.x);
          in = {bf16_values(grad ? ys : k.x, 41, small), bf16_values(ws, 42, small)};
          blocked = {nchw16c(in[0]), in[1]};
          // The filters the input gradient convolves dy with: w's flipped and transposed.
          Tensor f = in[1].to(DType::f64);
          if (grad) {
            f = Tensor::empty({k.x[1], k.o, 3, 3}, DType::f64);
            for (int64_t o = 0; o < k.o; ++o)
              for (int64_t c = 0; c < k.x[1]; ++c)
                for (int t = 0; t < 9; ++t)
                  f.data<double>()[(c * k.o + o) * 9 + t] =
                      bf16_to_float(in[1].data<bf16>()[(o * k.x[1] + c) * 9 + 8 - t]);
          }
          mag = winograd_magnitudes(in[0].to(DType::f64), f);
          if (bias) {
            in.push_back(bf16_values({k.o}, 43, small));
            blocked.push_back(in[2]);
          }
        }
        const Tensor raw = run_kernel(def, kern, b, blocked)[0];
        const Tensor got = name == "conv2d_grad_weight" ? raw : nchw_of(raw);
        std::vector<Tensor> wide;
        for (const Tensor& t : in) wide.push_back(t.to(DType::f64));
        const Tensor want = run_kernel(def, f64, b, wide)[0];
        for (int64_t e = 0; e < want.numel(); ++e) {
          const double x = want.data<double>()[e], g = bf16_to_float(got.data<bf16>()[e]);
          const double tol = std::ldexp(std::abs(x), -8) +
                             (small ? 0.0 : std::ldexp(mag[static_cast<size_t>(e)], -8) * 1.01);
          ASSERT_LE(std::abs(g - x), tol) << "[" << e << "] of " << x;
        }
        const int threads = omp_get_max_threads();
        omp_set_num_threads(3);
        const Tensor again = run_kernel(def, kern, b, blocked)[0];
        omp_set_num_threads(threads);
        EXPECT_EQ(std::memcmp(again.raw(), raw.raw(), raw.nbytes()), 0) << "3 threads";
        // NCHW activations (an eager run's) go through nChw16c copies: the same bits.
        const Attrs plain = [&] {
          Attrs p = b;
          p.set("x_blocked", false);
          p.set("y_blocked", false);
          return p;
        }();
        const Tensor flat = run_kernel(def, kern, plain, in)[0];
        EXPECT_EQ(std::memcmp(flat.raw(), got.raw(), got.nbytes()), 0) << "NCHW";
      }
  }
}

}  // namespace
}  // namespace flowrun::testing
