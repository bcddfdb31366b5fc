// The steady-state training step allocates no tensor memory: malloc and friends are interposed (through
// glibc's __libc_* entry points) and counted while steps run. flowrun's own code allocates nothing; oneDNN
// 2.6's primitive execute() builds a small argument map per call (a few allocations of a few dozen bytes,
// inside the library), so the test bounds the size of every allocation instead of requiring none. Its own executable, so the interposer touches no
// other test; not built under AddressSanitizer, which owns malloc itself.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstring>

#include "../unit/models.h"
#include "ops/cpu/dnnl_matmul.h"
#include "ops/cpu/gemm_avx2.h"

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);

static std::atomic<bool> g_counting{false};
static std::atomic<long> g_allocs{0};
static std::atomic<size_t> g_largest{0};

static void count(size_t n = 0) {
  if (!g_counting.load(std::memory_order_relaxed)) return;
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  size_t seen = g_largest.load(std::memory_order_relaxed);
  while (n > seen && !g_largest.compare_exchange_weak(seen, n)) {
  }
}
void* malloc(size_t n) {
  count(n);
  return __libc_malloc(n);
}
void* calloc(size_t a, size_t b) {
  count(a * b);
  return __libc_calloc(a, b);
}
void* realloc(void* p, size_t n) {
  count(n);
  return __libc_realloc(p, n);
}
void* aligned_alloc(size_t align, size_t n) {
  count(n);
  return __libc_memalign(align, n);
}
void* memalign(size_t align, size_t n) {
  count(n);
  return __libc_memalign(align, n);
}
int posix_memalign(void** out, size_t align, size_t n) {
  count(n);
  *out = __libc_memalign(align, n);
  return *out ? 0 : 12;  // ENOMEM
}
}

namespace flowrun::testing {
namespace {

long allocations_during(const std::function<void()>& f) {
  g_allocs = 0;
  g_largest = 0;
  g_counting = true;
  f();
  g_counting = false;
  return g_allocs.load();
}

TEST(NoAllocation, InterposerSeesAllocations) {
  // The counter works: a vector allocates.
  const long n = allocations_during([] {
    std::vector<int> v(1000);
    ASSERT_EQ(v.size(), 1000u);
  });
  EXPECT_GE(n, 1);
}

void expect_no_alloc_in_steps(Graph g, const CompileOptions& opts, const std::function<void(Executor&)>& feed) {
  Executor ex(compile(std::move(g), opts), kCpu, 5);
  init_params(ex, 1);
  if (ex.has_tensor("lr")) ex.tensor("lr").data<float>()[0] = 0.01f;
  for (int i = 0; i < 3; ++i) {  // warm-up: BLAS buffers, thread pool, oneDNN primitive caches
    feed(ex);
    ex.run();
  }
  const long n = allocations_during([&] {
    for (int i = 0; i < 10; ++i) {
      feed(ex);
      ex.run();
    }
  });
  // Bookkeeping inside oneDNN only: no allocation the size of an activation, and a bounded count per step.
  // Each oneDNN call allocates two or three small objects (its argument map), a Winograd weight gradient one
  // of 1568 bytes more; a convolution's weight gradient makes four calls per batch block (dnnl_conv.cc), the
  // convnet below 154 allocations a step in all.
  // Where oneDNN's gemm driver runs the products (below AVX-512 without AVX2: dnnl_matmul.h, gemm_avx2.h)
  // it also mallocs its no-copy kernel's workspace at each call, (256 x 16 + 64) floats.
  const bool driver = cpu::dnnl_gemm_driver() && !cpu::gemm_avx2_applies();
  EXPECT_LE(g_largest.load(), driver ? 16640u : 2048u) << n << " heap allocations in 10 steady-state steps";
  // There a product is also many one-thread calls (tiles, and chunks of K): the convnet makes 301 a step.
  EXPECT_LE(n, driver ? 10 * 600 : 10 * 300) << "heap allocations in 10 steady-state steps";
  std::printf("%ld allocations in 10 steps, largest %zu bytes\n", n, g_largest.load());
}

TEST(NoAllocation, MlpTrainingStep) {
  Graph g;
  build_mlp(g, 64, {784, 256, 128, 10}, true);
  CompileOptions opts;
  opts.optimizer.type = "sgd";
  opts.optimizer.momentum = 0.9;
  expect_no_alloc_in_steps(std::move(g), opts, [](Executor& ex) {
    Tensor& x = ex.tensor("x");
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(i % 7) * 0.1f;
    for (int64_t i = 0; i < 64; ++i) ex.tensor("y").data<int64_t>()[i] = i % 10;
  });
}

TEST(NoAllocation, TransformerBlockTrainingStep) {
  Graph g;
  build_transformer_block(g, 2, 16, 32, 4);
  CompileOptions opts;
  opts.optimizer.type = "sgd";
  expect_no_alloc_in_steps(std::move(g), opts, [](Executor& ex) {
    Tensor& x = ex.tensor("x");
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(i % 5) * 0.1f;
  });
}

// Mixed precision adds casts, widened kernels (f32 copies in planned workspaces) and the loss scaler.
TEST(NoAllocation, MixedPrecisionTransformerBlockTrainingStep) {
  for (DType low : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(low));
    Graph g;
    build_transformer_block(g, 2, 16, 32, 4);
    CompileOptions opts;
    opts.compute = low;
    opts.optimizer.type = "adamw";
    opts.optimizer.loss_scaling = low == DType::f16;
    expect_no_alloc_in_steps(std::move(g), opts, [](Executor& ex) {
      Tensor& x = ex.tensor("x");
      for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(i % 5) * 0.1f;
      ex.tensor("opt/step").data<int64_t>()[0] = 1;
      if (ex.has_tensor("amp/loss_scale")) ex.tensor("amp/loss_scale").data<float>()[0] = 1024.0f;
    });
  }
}

// A small CNN: conv (oneDNN primitive, blocked layout) -> relu -> 2x2 max pool -> conv -> relu -> linear head.
TEST(NoAllocation, ConvNetTrainingStep) {
  Graph g;
  GraphBuilder b(g);
  const ValueId x = b.input("x", {16, 3, 16, 16});
  const ValueId y = b.input("y", {16}, DType::i64);
  const Attrs pad1{{"padding", std::vector<int64_t>{1, 1}}};
  ValueId h = b.op1("relu", {b.op1("conv2d", {x, b.param("c1/w", {16, 3, 3, 3}), b.param("c1/b", {16})}, pad1)});
  h = b.op("maxpool2d", {h}, {{"kernel", std::vector<int64_t>{2, 2}}})[0];
  h = b.op1("relu", {b.op1("conv2d", {h, b.param("c2/w", {32, 16, 3, 3}), b.param("c2/b", {32})}, pad1)});
  h = b.reshape(h, {16, 32 * 8 * 8});
  const ValueId logits = b.op1("linear", {h, b.param("fc/w", {10, 32 * 8 * 8}), b.param("fc/b", {10})});
  g.mark_output("loss", b.op("cross_entropy", {logits, y})[0]);
  CompileOptions opts;
  opts.optimizer.type = "sgd";
  opts.optimizer.momentum = 0.9;
  expect_no_alloc_in_steps(std::move(g), opts, [](Executor& ex) {
    Tensor& x = ex.tensor("x");
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(i % 11) * 0.1f - 0.5f;
    for (int64_t i = 0; i < 16; ++i) ex.tensor("y").data<int64_t>()[i] = i % 10;
  });
}

}  // namespace
}  // namespace flowrun::testing
