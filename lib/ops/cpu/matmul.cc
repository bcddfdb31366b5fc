// GEMM-backed matmul and linear kernels.
#include "ops/cpu/matmul.h"

#include <cblas.h>

#include <algorithm>

#include "ops/cpu/dnnl_matmul.h"
#include "ops/cpu/elementwise.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/skinny_gemm.h"

namespace flowrun::cpu {

// f32 through oneDNN's matmul primitive (cached per shape, user scratchpad): measured here 1.2-1.9x
// OpenBLAS 0.3.21's sgemm on the training shapes, it shares flowrun's OpenMP pool, and unlike OpenBLAS's
// threaded sgemm it allocates nothing per call.
template <>
void gemm<float>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
                 float beta, float* c) {
  if (alpha == 1.0f && beta == 0.0f && !tb && skinny_gemm(ta, m, n, k, a, b, c)) return;
  dnnl_matmul(DType::f32, DType::f32, 1, m, n, k, ta, tb, 0, 0, alpha, beta, a, b, c);
}

bool gemm_fuses_beta(bool ta, bool tb, int64_t m, int64_t n, int64_t k) {
  return (tb || !skinny_gemm_applies(ta, m, n, k)) && dnnl_matmul_whole_k(m, n, k, ta);
}

template <>
void gemm<double>(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, const double* b,
                  double beta, double* c) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
              static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(ta ? m : k), b,
              static_cast<int>(tb ? k : n), beta, c, static_cast<int>(n));
}

namespace {

struct Dims {
  int64_t batch, m, n, k, a_stride, b_stride;
  bool ta, tb;
};

Dims dims_of(const KernelCtx& c) {
  const Shape &sa = *c.in[0].shape, &sb = *c.in[1].shape, &sy = *c.out[0].shape;
  Dims d;
  d.ta = c.attrs().b("trans_a");
  d.tb = c.attrs().b("trans_b");
  d.m = sy[sy.size() - 2];
  d.n = sy.back();
  d.k = d.ta ? sa[sa.size() - 2] : sa.back();
  d.batch = numel(sy) / (d.m * d.n);
  d.a_stride = sa.size() == 2 ? 0 : d.m * d.k;
  d.b_stride = sb.size() == 2 ? 0 : d.k * d.n;
  (void)sb;
  return d;
}

}  // namespace

void matmul(const KernelCtx& c) {
  const Dims d = dims_of(c);
  dispatch_float(c.in[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T *a = c.in[0].as<T>(), *b = c.in[1].as<T>();
    T* y = c.out[0].as<T>();
    if (d.b_stride == 0 && !d.ta) {
      // A batch of rows times one matrix is a single GEMM with batch*m rows.
      gemm<T>(false, d.tb, d.batch * d.m, d.n, d.k, T(1), a, b, T(0), y);
      return;
    }
    for (int64_t i = 0; i < d.batch; ++i)
      gemm<T>(d.ta, d.tb, d.m, d.n, d.k, T(1), a + i * d.a_stride, b + i * d.b_stride, T(0), y + i * d.m * d.n);
  });
}

// y in bf16, or in f32 under out_dtype (graph/amp.cc fold_f32_casts).
void matmul_bf16(const KernelCtx& c) {
  const Dims d = dims_of(c);
  const DType yt = c.out[0].dtype;
  // A batch of rows times one matrix is a single GEMM: oneDNN has no fast bf16 kernel for a broadcast
  // weight with stride 0 and would fall back to its reference loop.
  if (d.b_stride == 0 && !d.ta) {
    dnnl_matmul(DType::bf16, yt, 1, d.batch * d.m, d.n, d.k, false, d.tb, 0, 0, 1.0f, 0.0f, c.in[0].data,
                c.in[1].data, c.out[0].data);
    return;
  }
  dnnl_matmul(DType::bf16, yt, d.batch, d.m, d.n, d.k, d.ta, d.tb, d.a_stride, d.b_stride, 1.0f, 0.0f,
              c.in[0].data, c.in[1].data, c.out[0].data);
}

namespace {

// Where the GEMM writes: the output, or with a fused activation the pre-activation (output 1).
const TensorView& gemm_out(const KernelCtx& c) {
  return c.attrs().has("activation") ? c.out[1] : c.out[0];
}

// output 0 = gelu(output 1) under a fused activation, as the gelu op computes it.
void activate(const KernelCtx& c) {
  if (c.attrs().has("activation")) gelu(c.out[1], c.out[0], c.attrs().is("approximate", "tanh"));
}

}  // namespace

void linear_bf16(const KernelCtx& c) {
  const int64_t out = c.in[1].dim(0), in = c.in[1].dim(1);
  dnnl_linear(DType::bf16, gemm_out(c).dtype, c.in[0].numel() / in, out, in, c.in[0].data, c.in[1].data,
              c.num_in == 3 ? c.in[2].data : nullptr, gemm_out(c).data);
  activate(c);
}

void linear(const KernelCtx& c) {
  const int64_t out = c.in[1].dim(0), in = c.in[1].dim(1);
  const int64_t rows = c.in[0].numel() / in;
  if (c.in[0].dtype == DType::f32) {
    const float* bias = c.num_in == 3 ? c.in[2].as<float>() : nullptr;
    if (!skinny_linear(rows, out, in, c.in[0].as<float>(), c.in[1].as<float>(), bias,
                       gemm_out(c).as<float>()))
      dnnl_linear(DType::f32, DType::f32, rows, out, in, c.in[0].data, c.in[1].data, bias, gemm_out(c).data);
  } else {
    FR_CHECK(c.in[0].dtype == DType::f64, "no CPU kernel for dtype ", dtype_name(c.in[0].dtype));
    // f64 (the reference kernels' type, through BLAS): every row seeded with the bias, then x W^T added on
    // top in the same GEMM (beta = 1).
    double* y = gemm_out(c).as<double>();
    if (c.num_in == 3) {
      const double* b = c.in[2].as<double>();
      parallel_for(rows, 64, [&](int64_t s, int64_t e) {
        for (int64_t r = s; r < e; ++r) std::copy(b, b + out, y + r * out);
      });
    }
    gemm<double>(false, true, rows, out, in, 1.0, c.in[0].as<double>(), c.in[1].as<double>(),
                 c.num_in == 3 ? 1.0 : 0.0, y);
  }
  activate(c);
}

}  // namespace flowrun::cpu
