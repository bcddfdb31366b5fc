// Core types: dtype conversions, the CPU allocator, shapes, the counter-based RNG, graph dumps, registry
// errors, autodiff fan-out, and bitwise determinism of a training step.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

#include "models.h"
#include "ops/cpu/dnnl_matmul.h"
#include "ops/cpu/gemm_avx2.h"
#include "ops/cpu/matmul.h"

namespace flowrun::testing {
namespace {

TEST(DType, F16RoundTripsEveryValue) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const f16 h{static_cast<uint16_t>(b)};
    const float f = f16_to_float(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(f))));
      continue;
    }
    EXPECT_EQ(float_to_f16(f).bits, h.bits) << "bits " << b;
  }
}

TEST(DType, F16RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties go to the even mantissa (1.0).
  EXPECT_EQ(float_to_f16(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
  EXPECT_EQ(float_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3c02);
  EXPECT_EQ(float_to_f16(65504.0f).bits, 0x7bff);   // max finite
  EXPECT_EQ(float_to_f16(65520.0f).bits, 0x7c00);   // rounds up to inf
  EXPECT_EQ(float_to_f16(5.9604645e-8f).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_f16(2.9802322e-8f).bits, 0x0000);  // half of it: tie to even (zero)
  EXPECT_EQ(float_to_f16(-0.0f).bits, 0x8000);
}

TEST(DType, Bf16RoundTripsAndRoundsToNearestEven) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = bf16_to_float(bf16{static_cast<uint16_t>(b)});
    if (!std::isnan(f)) {
      EXPECT_EQ(float_to_bf16(f).bits, b);
    }
  }
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);      // tie -> even
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
}

TEST(DType, ParseNames) {
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  EXPECT_EQ(parse_dtype("float16"), DType::f16);
  EXPECT_FALSE(parse_dtype("f8").has_value());
}

// The VmFlags line of the mapping of /proc/self/smaps that holds p ("" if none does).
std::string vm_flags_of(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' '))
      inside = lo <= at && at < hi;
    else if (inside && line.rfind("VmFlags:", 0) == 0)
      return line;
  }
  return "";
}

TEST(CpuAllocator, LargeBuffersAreHugePageAlignedAndAdvised) {
  Allocator& cpu = allocator_for(kCpu);
  void* small = cpu.allocate(kHugeFrom - 1);
  void* large = cpu.allocate(kHugeFrom + 1);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small) % kAlignment, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(large) % kHugePage, 0u);
  if (!transparent_huge_pages()) {
    std::printf("transparent huge pages are off here: only the alignment is checked\n");
  } else {
    const std::string flags = vm_flags_of(large);
    EXPECT_NE(flags.find(" hg"), std::string::npos) << "the large buffer's mapping: " << flags;
  }
  cpu.deallocate(small);
  cpu.deallocate(large);
}

// What a prediction counts for a CPU buffer: its bytes, or whole huge pages from kHugeFrom on where the
// kernel gives transparent huge pages.
TEST(CpuAllocator, ResidentBytesRoundLargeBuffersToWholeHugePages) {
  for (const bool thp : {false, true}) {
    EXPECT_EQ(resident_bytes(0, thp), 0u);
    EXPECT_EQ(resident_bytes(kHugeFrom - 1, thp), kHugeFrom - 1);
    EXPECT_EQ(resident_bytes(kHugeFrom, thp), kHugeFrom);
    EXPECT_EQ(resident_bytes(kHugeFrom + 1, thp), thp ? kHugeFrom + kHugePage : kHugeFrom + 1);
    EXPECT_EQ(resident_bytes(kHugeFrom + kHugePage, thp), kHugeFrom + kHugePage);
  }
  // 140.51 MiB (gpt-tiny's fp32 arena) held as 71 huge pages.
  EXPECT_EQ(resident_bytes(147332160, true), 71 * kHugePage);
}

TEST(Shape, Broadcasting) {
  EXPECT_EQ(*broadcast_shapes({4, 1, 3}, {5, 1}), (Shape{4, 5, 3}));
  EXPECT_EQ(*broadcast_shapes({}, {2, 3}), (Shape{2, 3}));
  EXPECT_FALSE(broadcast_shapes({2, 3}, {4, 3}).has_value());
}

TEST(Rng, CounterBasedAndReproducible) {
  const RngStream a{42, 7}, b{42, 7}, c{42, 8}, d{43, 7};
  int same_c = 0, same_d = 0;
  double mean = 0;
  for (uint64_t i = 0; i < 10000; ++i) {
    EXPECT_EQ(a.uniform(i), b.uniform(i));
    same_c += a.uniform(i) == c.uniform(i);
    same_d += a.uniform(i) == d.uniform(i);
    mean += a.uniform(i) / 10000.0;
    ASSERT_GE(a.uniform(i), 0.0f);
    ASSERT_LT(a.uniform(i), 1.0f);
  }
  EXPECT_LT(same_c, 5);
  EXPECT_LT(same_d, 5);
  EXPECT_NEAR(mean, 0.5, 0.01);
  // Known-answer test from the Random123 distribution (philox4x32-10, all-ones counter and key... zero case).
  const auto z = philox4x32({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(z[0], 0x6627e8d5u);
  EXPECT_EQ(z[1], 0xe169c58du);
  EXPECT_EQ(z[2], 0xbc57ac4cu);
  EXPECT_EQ(z[3], 0x9b00dbd8u);
}

TEST(Registry, UnknownOpSuggestsClosest) {
  Graph g;
  GraphBuilder b(g);
  const ValueId x = b.input("x", {2, 3});
  try {
    b.op1("rellu", {x});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::bad_input);
    EXPECT_NE(std::string(e.what()).find("did you mean 'relu'"), std::string::npos) << e.what();
  }
}

TEST(Graph, ShapeErrorsNameTheNode) {
  Graph g;
  GraphBuilder b(g);
  const ValueId x = b.input("x", {2, 3}), w = b.param("w", {4, 5});
  try {
    b.op1("matmul", {x, w}, {}, "fc1");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fc1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2,3]"), std::string::npos) << e.what();
  }
}

TEST(Graph, TextAndDotDumps) {
  Graph g;
  build_mlp(g, 4, {6, 5, 3}, true);
  const std::string text = g.to_text(), dot = g.to_dot();
  EXPECT_NE(text.find("param %"), std::string::npos);
  EXPECT_NE(text.find("= linear("), std::string::npos);
  EXPECT_NE(text.find("output loss"), std::string::npos);
  EXPECT_EQ(dot.rfind("digraph flowrun {", 0), 0u);
  EXPECT_NE(dot.find("->"), std::string::npos);
}

TEST(Autodiff, FanOutAccumulatesAndStopGradientBlocks) {
  // loss = sum(x*w + x*w + stop_gradient(x*w)) -> d/dw = 2 * x
  Graph g;
  GraphBuilder b(g);
  const ValueId x = b.input("x", {3}, DType::f64), w = b.param("w", {3}, DType::f64);
  const ValueId xw = b.mul(x, w);
  const ValueId s = b.add(b.add(xw, xw), b.op1("stop_gradient", {xw}));
  g.mark_output("loss", b.reduce_sum(s, {}));
  Executor ex(compile(std::move(g), {}));
  ex.tensor("x").fill_from({1.0, -2.0, 0.5});
  ex.tensor("w").fill_from({3.0, 4.0, 5.0});
  ex.run();
  EXPECT_EQ(ex.output("loss").to_f64()[0], 3.0 * (3.0 - 8.0 + 2.5));
  EXPECT_EQ(ex.output("grad/w").to_f64(), (std::vector<double>{2.0, -4.0, 1.0}));
}

TEST(Autodiff, InputsGetNoGradientAndUnusedParamsAreSkipped) {
  Graph g;
  GraphBuilder b(g);
  const ValueId x = b.input("x", {3}), w = b.param("w", {3});
  b.param("unused", {2});
  g.mark_output("loss", b.reduce_sum(b.mul(x, w), {}));
  const Program p = compile(std::move(g), {});
  EXPECT_TRUE(p.graph.outputs().count("grad/w"));
  EXPECT_FALSE(p.graph.outputs().count("grad/x"));
  EXPECT_FALSE(p.graph.outputs().count("grad/unused"));
}

TEST(Autodiff, LossMustBeAScalar) {
  Graph g;
  GraphBuilder b(g);
  const ValueId w = b.param("w", {3});
  g.mark_output("loss", b.mul_scalar(w, 2.0));
  EXPECT_THROW(compile(std::move(g), {}), Error);
}

TEST(Matmul, Bf16MatchesF32OfRoundedInputs) {
  const int64_t m = 37, k = 64, n = 29;
  auto run = [&](DType t, const std::vector<double>& a, const std::vector<double>& bv) {
    Graph g;
    GraphBuilder b(g);
    g.mark_output("y", b.matmul(b.input("a", {m, k}, t), b.input("b", {k, n}, t)));
    CompileOptions o;
    o.loss = "";
    Executor ex(compile(std::move(g), o));
    ex.tensor("a").fill_from(a);
    ex.tensor("b").fill_from(bv);
    ex.run();
    return ex.output("y").to_f64();
  };
  std::vector<double> a(static_cast<size_t>(m * k)), bv(static_cast<size_t>(k * n));
  const RngStream r{1, 2};
  for (size_t i = 0; i < a.size(); ++i) a[i] = bf16_to_float(float_to_bf16(2 * r.uniform(i) - 1));
  for (size_t i = 0; i < bv.size(); ++i) bv[i] = bf16_to_float(float_to_bf16(2 * r.uniform(i + 9999) - 1));
  const auto y16 = run(DType::bf16, a, bv), y32 = run(DType::f32, a, bv);
  for (size_t i = 0; i < y32.size(); ++i)
    EXPECT_NEAR(y16[i], y32[i], std::fabs(y32[i]) * 1.0 / 128 + 1e-3) << i;  // one bf16 rounding of the output
}

// f32 products through oneDNN in every transpose combination, against f64: shapes with edge blocks, a long K
// cut into chunks, long weight gradients with fewer rows than columns (A transposed, m < n, K chunked), which
// run as their transpose and are transposed back (dnnl_matmul.cc swaps), with alpha, and sums added on top
// of y (beta).
TEST(Matmul, F32ProductsMatchFloat64) {
  struct Case {
    int64_t m, n, k;
    bool ta, tb;
    float alpha, beta;
  };
  const RngStream r{3, 4};
  for (const Case& c : {Case{37, 29, 64, false, false, 1, 0}, Case{37, 29, 64, true, true, 1, 0},
                        Case{19, 100, 50, true, false, 1, 0}, Case{19, 100, 50, true, false, 0.5f, 0},
                        Case{19, 100, 50, true, false, 1, 1}, Case{40, 300, 2100, true, false, 1, 0},
                        Case{40, 300, 2100, true, false, 0.5f, 0}, Case{300, 40, 2100, true, false, 1, 0},
                        Case{70, 33, 300, false, true, 1, 0}}) {
    SCOPED_TRACE(::testing::Message() << c.m << " x " << c.n << " x " << c.k << (c.ta ? " ta" : "")
                                      << (c.tb ? " tb" : "") << " alpha " << c.alpha << " beta " << c.beta);
    std::vector<float> a(static_cast<size_t>(c.m * c.k)), b(static_cast<size_t>(c.k * c.n)),
        y(static_cast<size_t>(c.m * c.n));
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(2 * r.uniform(i) - 1);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(2 * r.uniform(i + a.size()) - 1);
    for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<float>(r.uniform(i + a.size() + b.size()));
    const std::vector<float> y0 = y;
    cpu::dnnl_matmul(DType::f32, DType::f32, 1, c.m, c.n, c.k, c.ta, c.tb, 0, 0, c.alpha, c.beta, a.data(),
                     b.data(), y.data());
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double want = 0, mag = 0;
        for (int64_t p = 0; p < c.k; ++p) {
          const double x = a[static_cast<size_t>(c.ta ? p * c.m + i : i * c.k + p)];
          const double w = b[static_cast<size_t>(c.tb ? j * c.k + p : p * c.n + j)];
          want += x * w;
          mag += std::fabs(x * w);
        }
        const size_t at = static_cast<size_t>(i * c.n + j);
        want = c.alpha * want + c.beta * y0[at];
        ASSERT_NEAR(y[at], want, 1e-6 * (mag + 1)) << i << ", " << j;
      }
  }
}

// What fuse_momentum_products rests on: where gemm_fuses_beta holds, gemm<float> with beta gives
// fma(beta, y, product) bit for bit, the product being gemm's with beta 0 (oneDNN adds the sum post-op's term
// within its one rounding), at 1 and 2 threads: weight gradients (A transposed) of the bench MLP, gpt-tiny
// and odd sizes, K up to 2047 (at 2048 the sum is cut into chunks and gemm_fuses_beta says no), and the
// other transpose combinations.
TEST(Matmul, BetaIsOneFmaOnTheProduct) {
  struct Case {
    int64_t m, n, k;
    bool ta, tb;
  };
  // oneDNN's gemm driver (below AVX-512) scales C by beta before it adds the product: no fusion where it
  // runs the products, on CPUs without AVX2 (gemm_avx2.h).
  if (!cpu::dnnl_matmul_whole_k(512, 512, 128, true)) {
    EXPECT_FALSE(cpu::gemm_fuses_beta(true, false, 512, 512, 128));
    GTEST_SKIP() << "oneDNN has no brgemm matmul below AVX-512: gemm_fuses_beta is false";
  }
  const RngStream r{5, 6};
  const int threads = omp_get_max_threads();
  for (const int t : {1, 2}) {
    omp_set_num_threads(t);
    for (const Case& c : {Case{512, 784, 128, true, false}, Case{512, 512, 128, true, false},
                          Case{1024, 256, 2047, true, false}, Case{256, 1024, 1000, true, false},
                          Case{37, 530, 300, true, false}, Case{70, 33, 300, false, true},
                          Case{200, 48, 1500, false, false}, Case{48, 200, 65, true, true}}) {
      SCOPED_TRACE(::testing::Message() << c.m << " x " << c.n << " x " << c.k << (c.ta ? " ta" : "")
                                        << (c.tb ? " tb" : "") << ", " << t << " threads");
      ASSERT_TRUE(cpu::gemm_fuses_beta(c.ta, c.tb, c.m, c.n, c.k));
      std::vector<float> a(static_cast<size_t>(c.m * c.k)), b(static_cast<size_t>(c.k * c.n)),
          y(static_cast<size_t>(c.m * c.n)), product(y.size());
      for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(2 * r.uniform(i) - 1);
      for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(2 * r.uniform(i + a.size()) - 1);
      for (size_t i = 0; i < y.size(); ++i)
        y[i] = static_cast<float>(r.uniform(i + a.size() + b.size()) - 0.5);
      const float beta = 0.9f;
      std::vector<float> want = y;
      cpu::gemm<float>(c.ta, c.tb, c.m, c.n, c.k, 1.0f, a.data(), b.data(), 0.0f, product.data());
      for (size_t i = 0; i < want.size(); ++i) want[i] = std::fma(beta, want[i], product[i]);
      cpu::gemm<float>(c.ta, c.tb, c.m, c.n, c.k, 1.0f, a.data(), b.data(), beta, y.data());
      EXPECT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(float)));
    }
  }
  omp_set_num_threads(threads);
  // oneDNN's sum of 2048 is cut into chunks (dnnl_matmul.cc splits_k); gemm_avx2 sums any K in one chain.
  EXPECT_EQ(cpu::gemm_fuses_beta(true, false, 512, 512, 2048), cpu::gemm_avx2_applies());
}

// A small GPT block (x and target 2 x 8 x 16) trained by SGD with momentum.
Program block_with_sgd() {
  Graph g;
  build_transformer_block(g, 2, 8, 16, 2);
  CompileOptions opts;
  opts.optimizer.type = "sgd";
  opts.optimizer.momentum = 0.9;
  return compile(std::move(g), opts);
}

TEST(Determinism, TrainingStepsAreBitwiseReproducible) {
  auto train = [] {
    Executor ex(block_with_sgd(), kCpu, 11);
    init_params(ex, 4);
    ex.tensor("lr").data<float>()[0] = 0.05f;
    std::vector<double> x(static_cast<size_t>(ex.tensor("x").numel()));
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<double>(i));
    ex.tensor("x").fill_from(x);
    std::vector<float> losses;
    for (int s = 0; s < 5; ++s) {
      ex.run();
      losses.push_back(static_cast<float>(ex.output("loss").to_f64()[0]));
    }
    return std::make_pair(losses, ex.tensor("fc/weight").to_f64());
  };
  const auto a = train(), b = train();
  EXPECT_EQ(std::memcmp(a.first.data(), b.first.data(), a.first.size() * sizeof(float)), 0);
  EXPECT_EQ(a.second, b.second);
  EXPECT_LT(a.first.back(), a.first.front());
}

TEST(Executor, BoundInputsAreReadInPlace) {
  // x feeds the first layernorm and the residual add; "target" the loss. One executor is given each step's
  // batch by copy, the other reads the batch tensors themselves: the same losses and parameters, bit for bit.
  Executor copied(block_with_sgd(), kCpu, 11), bound(block_with_sgd(), kCpu, 11);
  for (Executor* ex : {&copied, &bound}) {
    init_params(*ex, 4);
    ex->tensor("lr").data<float>()[0] = 0.05f;
  }
  for (int s = 0; s < 3; ++s) {
    Tensor x = Tensor::empty({2, 8, 16}, DType::f32), target = Tensor::empty({2, 8, 16}, DType::f32);
    std::vector<double> xv(static_cast<size_t>(x.numel())), tv(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) {
      xv[i] = std::sin(static_cast<double>(i + 7 * static_cast<size_t>(s)));
      tv[i] = std::cos(static_cast<double>(3 * i + static_cast<size_t>(s)));
    }
    x.fill_from(xv);
    target.fill_from(tv);
    copied.tensor("x").fill_from(xv);
    copied.tensor("target").fill_from(tv);
    ASSERT_TRUE(bound.bind_input("x", x));
    ASSERT_TRUE(bound.bind_input("target", target));
    EXPECT_EQ(bound.tensor("x").raw(), x.raw());
    copied.run();
    bound.run();
    EXPECT_EQ(copied.output("loss").to_f64(), bound.output("loss").to_f64()) << "step " << s;
  }
  EXPECT_EQ(copied.tensor("fc/weight").to_f64(), bound.tensor("fc/weight").to_f64());
  EXPECT_EQ(copied.tensor("ln1/weight").to_f64(), bound.tensor("ln1/weight").to_f64());
  EXPECT_THROW(bound.bind_input("fc/weight", copied.tensor("fc/weight")), Error);  // a parameter
  EXPECT_THROW(bound.bind_input("x", Tensor::empty({2, 8, 8}, DType::f32)), Error);
  EXPECT_THROW(bound.bind_input("x", Tensor::empty({2, 8, 16}, DType::f64)), Error);
}

}  // namespace
}  // namespace flowrun::testing
