// gemm_avx2.h: flowrun's AVX2 f32 GEMM gives the bits of a plain fma loop over k, whatever the layout, the
// edges of its tiles and register blocks, and the thread count. Through dnnl_matmul and dnnl_linear, which
// run it where it applies.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ops/cpu/dnnl_matmul.h"
#include "ops/cpu/gemm_avx2.h"

namespace flowrun {
namespace {

struct Case {
  int64_t batch, m, n, k;
  bool ta, tb, shared_b;
  float alpha, beta;
};

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// y = fma(beta, y, alpha * sum + bias), the sum one fma chain from 0 over k in order.
void reference(const Case& c, const float* a, const float* b, const float* bias, float* y) {
  const int64_t lda = c.ta ? c.m : c.k, ldb = c.tb ? c.k : c.n;
  for (int64_t mat = 0; mat < c.batch; ++mat) {
    const float* am = a + mat * c.m * c.k;
    const float* bm = b + (c.shared_b ? 0 : mat * c.k * c.n);
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        float s = 0.0f;
        for (int64_t q = 0; q < c.k; ++q)
          s = std::fma(c.ta ? am[q * lda + i] : am[i * lda + q], c.tb ? bm[j * ldb + q] : bm[q * ldb + j], s);
        float v = c.alpha != 1.0f ? s * c.alpha : s;
        if (bias) v += bias[j];
        float& out = y[(mat * c.m + i) * c.n + j];
        out = c.beta != 0.0f ? std::fma(c.beta, out, v) : v;
      }
  }
}

class GemmAvx2 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cpu::gemm_avx2_applies()) GTEST_SKIP() << "gemm_avx2 runs only on AVX2 hosts without AVX-512";
  }
};

TEST_F(GemmAvx2, BitsOfAPlainFmaLoopAtAnyThreadCount) {
  // Edges of the 6 x 16 register tiles, the 132 x 128 thread tiles (and the narrower ones of a product with
  // few tiles) and the 256-long k blocks; both transpositions; alpha, beta; a batch with B shared or not; K =
  // 0 and 1; a transposed a's strips packed in groups (whole, cut by m, several per matrix), and a k block at
  // a time.
  const std::vector<Case> cases = {
      {1, 1, 1, 1, false, false, false, 1.0f, 0.0f},
      {1, 7, 17, 9, false, false, false, 1.0f, 0.0f},
      {1, 130, 129, 300, false, false, false, 1.0f, 0.0f},
      {1, 130, 129, 300, true, false, false, 1.0f, 0.0f},
      {1, 130, 129, 300, false, true, false, 1.0f, 0.0f},
      {1, 130, 129, 300, true, true, false, 1.0f, 0.0f},
      {1, 64, 48, 513, true, false, false, 0.5f, 0.9f},
      {1, 33, 40, 17, false, true, false, 1.0f, 1.0f},
      {3, 20, 35, 23, false, true, false, 1.0f, 0.0f},
      {3, 20, 35, 25, true, false, true, 1.0f, 0.0f},
      {1, 5, 23, 0, false, false, false, 1.0f, 0.5f},
      {2, 128, 256, 64, false, false, true, 1.0f, 0.0f},
      {1, 270, 140, 40, false, false, false, 1.0f, 0.0f},
      {1, 133, 200, 31, true, true, false, 1.0f, 0.0f},
      {2, 300, 24, 20, true, false, false, 1.0f, 0.0f},
      // A transposed a over several k blocks in one-tile-wide rows: packed a k block at a time in the tile.
      {1, 800, 40, 600, true, false, false, 0.5f, 0.9f},
      {2, 800, 200, 300, true, true, true, 1.0f, 0.0f},
      // Two such rows: kept whole at 1 and 2 threads, narrowed at 3.
      {1, 264, 100, 300, true, false, false, 1.0f, 0.0f},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << c.batch << " x " << c.m << " x " << c.n << " x " << c.k << " ta " << c.ta << " tb "
                 << c.tb << " shared " << c.shared_b << " alpha " << c.alpha << " beta " << c.beta);
    const auto a = random_floats(static_cast<size_t>(c.batch * c.m * c.k), 1);
    const auto b = random_floats(static_cast<size_t>((c.shared_b ? 1 : c.batch) * c.k * c.n), 2);
    const auto y0 = random_floats(static_cast<size_t>(c.batch * c.m * c.n), 3);
    std::vector<float> want = y0;
    reference(c, a.data(), b.data(), nullptr, want.data());
    const int saved = omp_get_max_threads();
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::vector<float> got = y0;
      cpu::dnnl_matmul(DType::f32, DType::f32, c.batch, c.m, c.n, c.k, c.ta, c.tb, c.m * c.k,
                       c.shared_b ? 0 : c.k * c.n, c.alpha, c.beta, a.data(), b.data(), got.data());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << threads << " threads";
    }
    omp_set_num_threads(saved);
  }
}

TEST_F(GemmAvx2, LinearAddsTheBiasToTheWholeSum) {
  const Case c{1, 70, 50, 300, false, true, false, 1.0f, 0.0f};
  const auto x = random_floats(static_cast<size_t>(c.m * c.k), 4);
  const auto w = random_floats(static_cast<size_t>(c.n * c.k), 5);
  const auto bias = random_floats(static_cast<size_t>(c.n), 6);
  std::vector<float> want(static_cast<size_t>(c.m * c.n)), got(want.size());
  reference(c, x.data(), w.data(), bias.data(), want.data());
  cpu::dnnl_linear(DType::f32, DType::f32, c.m, c.n, c.k, x.data(), w.data(), bias.data(), got.data());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace flowrun
