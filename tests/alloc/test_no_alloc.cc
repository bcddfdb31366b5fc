// The steady-state training step allocates nothing: malloc and friends are interposed (through glibc's
// __libc_* entry points) and counted while steps run. Its own executable, so the interposer touches no
// other test; not built under AddressSanitizer, which owns malloc itself.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>

#include "../unit/models.h"

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);

static std::atomic<bool> g_counting{false};
static std::atomic<long> g_allocs{0};

static void count() {
  if (g_counting.load(std::memory_order_relaxed)) g_allocs.fetch_add(1, std::memory_order_relaxed);
}
void* malloc(size_t n) {
  count();
  return __libc_malloc(n);
}
void* calloc(size_t a, size_t b) {
  count();
  return __libc_calloc(a, b);
}
void* realloc(void* p, size_t n) {
  count();
  return __libc_realloc(p, n);
}
void* aligned_alloc(size_t align, size_t n) {
  count();
  return __libc_memalign(align, n);
}
void* memalign(size_t align, size_t n) {
  count();
  return __libc_memalign(align, n);
}
int posix_memalign(void** out, size_t align, size_t n) {
  count();
  *out = __libc_memalign(align, n);
  return *out ? 0 : 12;  // ENOMEM
}
}

namespace flowrun::testing {
namespace {

long allocations_during(const std::function<void()>& f) {
  g_allocs = 0;
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
  EXPECT_EQ(n, 0) << "heap allocations in 10 steady-state steps";
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

}  // namespace
}  // namespace flowrun::testing
