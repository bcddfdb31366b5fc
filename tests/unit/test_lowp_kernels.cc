// Low-precision kernels: the vectorised f32 <-> bf16/f16 conversions against core/dtype.h's scalar
// reference, and each native bf16 kernel against the f32 kernel run widened (inputs widened, outputs
// rounded).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/tensor.h"
#include "ops/cpu/elementwise.h"
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

// Runs `fn` on `in` into fresh outputs of the given types, with the op's planned workspace.
std::vector<Tensor> run_kernel(const OpDef& def, KernelFn fn, const Attrs& attrs,
                               const std::vector<Tensor>& in) {
  std::vector<TensorType> it, ot;
  for (const Tensor& t : in) it.push_back({t.shape(), t.dtype()});
  ot = def.infer(it, attrs);
  Node node;
  node.op = def.name;
  node.attrs = attrs;
  std::vector<TensorView> iv, ov;
  for (const Tensor& t : in) iv.push_back({t.raw(), &t.shape(), t.dtype()});
  std::vector<Tensor> out;
  for (const TensorType& t : ot) out.push_back(Tensor::zeros(t.shape, t.dtype));
  for (Tensor& t : out) ov.push_back({t.raw(), &t.shape(), t.dtype()});
  const size_t ws_bytes = def.workspace ? def.workspace(it, ot, attrs) : 0;
  std::vector<double> ws(ws_bytes / sizeof(double) + 1);
  KernelCtx c;
  c.node = &node;
  c.in = iv.data();
  c.num_in = static_cast<int>(iv.size());
  c.out = ov.data();
  c.num_out = static_cast<int>(ov.size());
  c.workspace = ws.data();
  c.workspace_bytes = ws_bytes;
  fn(c);
  return out;
}

// The native bf16 kernel of `op` must equal its f32 kernel on the widened inputs, rounded once per output:
// both compute in f32 in the same order.
void expect_native_matches_widened(const std::string& op, const Attrs& attrs, const std::vector<Tensor>& in) {
  const OpDef& def = OpRegistry::get().at(op);
  const KernelChoice native = select_kernel(def, DeviceKind::cpu, DType::bf16);
  ASSERT_TRUE(native.kernel && !native.widened) << op << " has no native bf16 kernel";
  std::vector<Tensor> wide;
  for (const Tensor& t : in) wide.push_back(t.to(DType::f32));
  const std::vector<Tensor> got = run_kernel(def, native.kernel->fn, attrs, in);
  const std::vector<Tensor> want = run_kernel(def, def.kernel(DeviceKind::cpu, DType::f32)->fn, attrs, wide);
  ASSERT_EQ(got.size(), want.size());
  for (size_t j = 0; j < got.size(); ++j) {
    ASSERT_EQ(got[j].dtype(), DType::bf16);
    ASSERT_EQ(got[j].shape(), want[j].shape());
    for (int64_t e = 0; e < got[j].numel(); ++e)
      ASSERT_EQ(got[j].data<bf16>()[e].bits, float_to_bf16(want[j].data<float>()[e]).bits)
          << op << " output " << j << " [" << e << "] of " << want[j].data<float>()[e];
  }
}

// Large enough (24576 elements) for the multi-threaded paths.
const Shape kBig = {4, 64, 96};

TEST(LowpKernels, GeluAndGradientMatchWidenedFloat32) {
  for (const char* approx : {"none", "tanh"}) {
    SCOPED_TRACE(approx);
    const Attrs a{{"approximate", std::string(approx)}};
    expect_native_matches_widened("gelu", a, {bf16_input(kBig, 1)});
    expect_native_matches_widened("gelu_grad", a, {bf16_input(kBig, 2), bf16_input(kBig, 3)});
  }
}

TEST(LowpKernels, ActivationGradientsMatchWidenedFloat32) {
  for (const char* op : {"relu_grad", "silu_grad", "tanh_grad", "sigmoid_grad"}) {
    SCOPED_TRACE(op);
    expect_native_matches_widened(op, {}, {bf16_input(kBig, 4), bf16_input(kBig, 5)});
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

}  // namespace
}  // namespace flowrun::testing
