// matmul and linear through cuBLASLt. flowrun's tensors are row-major and cuBLASLt's matrices column-major:
// a row-major C = op(A) op(B) (M x N) is the column-major C^T = op(B)^T op(A)^T (N x M), so B goes first and
// every matrix is passed as it is stored. Accumulation is f32 (no TF32) for every storage type; a linear's
// bias (and a fused tanh GELU) is applied by the GEMM's epilogue. The handle, a 32 MiB workspace and the
// chosen algorithm of each shape are made on first use and kept, so a training step allocates nothing.
#include <cublasLt.h>

#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace flowrun::cuda {

namespace {

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw runtime_error(cat("cuBLASLt error in ", what, ": ", cublasLtGetStatusString(s)));
}

cudaDataType data_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::f16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
    default:
      throw runtime_error(cat("cuBLASLt matmul: no ", dtype_name(t), " kernel"));
  }
}

// One GEMM problem: the key of the algorithm cache. gelu: the GELU epilogue writing the pre-activation to
// an auxiliary matrix laid out as C.
struct Problem {
  DType t;
  bool ta, tb, bias, gelu;
  int64_t m, n, k, batch, stride_a, stride_b;
  auto key() const { return std::tie(t, ta, tb, bias, gelu, m, n, k, batch, stride_a, stride_b); }
  bool operator<(const Problem& o) const { return key() < o.key(); }
};

class Lt {
 public:
  static Lt& get() {
    static Lt lt;
    return lt;
  }
  cublasLtHandle_t handle() const { return handle_; }
  void* workspace() const { return workspace_; }
  static constexpr size_t kWorkspace = size_t{32} << 20;  // what cuBLAS recommends for Hopper
  std::mutex mutex;
  std::map<Problem, cublasLtMatmulAlgo_t> algos;
  std::set<Problem> no_gelu_algo;  // GELU-epilogue problems cuBLASLt has no algorithm for

 private:
  Lt() {
    check_lt(cublasLtCreate(&handle_), "cublasLtCreate");
    workspace_ = alloc(kWorkspace);
  }
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
};

// The descriptors of one call, destroyed with it.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~Descriptors() {
    if (op) cublasLtMatmulDescDestroy(op);
    for (cublasLtMatrixLayout_t l : {a, b, c})
      if (l) cublasLtMatrixLayoutDestroy(l);
  }
};

// A column-major rows x cols layout with leading dimension `ld`, `batch` matrices `stride` elements apart.
cublasLtMatrixLayout_t layout(DType t, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                              int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  check_lt(cublasLtMatrixLayoutCreate(&l, data_type(t), static_cast<uint64_t>(rows),
                                      static_cast<uint64_t>(cols), ld),
           "cublasLtMatrixLayoutCreate");
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count),
             "batch count");
    check_lt(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                              sizeof stride),
             "batch stride");
  }
  return l;
}

// Row-major C[i] (m x n) = op(A[i]) (m x k) op(B[i]) (k x n) (+ bias[n] on every row), i < batch, the
// matrices stride_a / stride_b elements apart (0: one matrix for every i). With p.gelu (one matrix, n a
// multiple of 8), C = gelu_tanh(that) and aux = that, rounded to C's type; false, and nothing done, when
// cuBLASLt has no algorithm for that epilogue (the caller computes it otherwise). Other GEMMs throw.
bool gemm(const Problem& p, const void* a, const void* b, void* c, const void* bias, void* aux,
          cudaStream_t s) {
  Lt& lt = Lt::get();
  Descriptors d;
  check_lt(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t first = p.tb ? CUBLAS_OP_T : CUBLAS_OP_N, second = p.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &first, sizeof first), "transa");
  check_lt(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &second, sizeof second),
           "transb");
  if (bias || p.gelu) {
    const cublasLtEpilogue_t e = !p.gelu ? CUBLASLT_EPILOGUE_BIAS
                                 : bias  ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                         : CUBLASLT_EPILOGUE_GELU_AUX;
    check_lt(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e), "epilogue");
  }
  if (bias)
    check_lt(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
             "bias");
  if (p.gelu) {
    // The auxiliary matrix is C's shape (column-major n x m) and, unset, C's type.
    const int64_t ld = p.n;
    check_lt(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux),
        "GELU auxiliary pointer");
    check_lt(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld),
             "GELU auxiliary leading dimension");
  }
  // Stored matrices as column-major: B (k x n row-major, or n x k when transposed) is n x k (k x n), A
  // likewise, C is n x m.
  d.b = layout(p.t, p.tb ? p.k : p.n, p.tb ? p.n : p.k, p.tb ? p.k : p.n, p.batch, p.stride_b);
  d.a = layout(p.t, p.ta ? p.m : p.k, p.ta ? p.k : p.m, p.ta ? p.m : p.k, p.batch, p.stride_a);
  d.c = layout(p.t, p.n, p.m, p.n, p.batch, p.n * p.m);

  cublasLtMatmulAlgo_t algo;
  {
    std::lock_guard<std::mutex> lock(lt.mutex);
    auto it = lt.algos.find(p);
    if (it == lt.algos.end()) {
      if (lt.no_gelu_algo.count(p)) return false;
      cublasLtMatmulPreference_t pref = nullptr;
      check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
      const size_t ws = Lt::kWorkspace;
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
      cublasLtMatmulHeuristicResult_t found{};
      int count = 0;
      const cublasStatus_t st =
          cublasLtMatmulAlgoGetHeuristic(lt.handle(), d.op, d.b, d.a, d.c, d.c, pref, 1, &found, &count);
      cublasLtMatmulPreferenceDestroy(pref);
      if (p.gelu && (st != CUBLAS_STATUS_SUCCESS || count == 0)) {
        lt.no_gelu_algo.insert(p);
        return false;
      }
      check_lt(st, "cublasLtMatmulAlgoGetHeuristic");
      if (count == 0)
        throw runtime_error(cat("cuBLASLt has no algorithm for a ", dtype_name(p.t), " GEMM of ", p.m, " x ",
                                p.n, " x ", p.k));
      it = lt.algos.emplace(p, found.algo).first;
    }
    algo = it->second;
  }
  const float one = 1.0f, zero = 0.0f;
  check_lt(cublasLtMatmul(lt.handle(), d.op, &one, b, d.b, a, d.a, &zero, c, d.c, c, d.c, &algo,
                          lt.workspace(), Lt::kWorkspace, s),
           "cublasLtMatmul");
  return true;
}

}  // namespace

// The shapes as ops/matmul.cc infers them: a (..., M, K) or its transpose, b (..., K, N) or one K x N matrix
// for every batch (or a one matrix and b batched), C (batch..., M, N).
void matmul(const KernelCtx& c) {
  const TensorView &a = c.in[0], &b = c.in[1], &y = c.out[0];
  const bool ta = c.attrs().b("trans_a"), tb = c.attrs().b("trans_b");
  const Shape &sa = *a.shape, &sb = *b.shape;
  const int64_t ra = sa[sa.size() - 2], ca = sa.back(), rb = sb[sb.size() - 2], cb = sb.back();
  Problem p{y.dtype, ta, tb, false, false, ta ? ca : ra, tb ? rb : cb, ta ? ra : ca, 1, 0, 0};
  p.batch = y.numel() / (p.m * p.n);
  p.stride_a = sa.size() == 2 ? 0 : ra * ca;
  p.stride_b = sb.size() == 2 ? 0 : rb * cb;
  if (p.stride_b == 0 && !ta && p.batch > 1) {  // a shared B: one GEMM over every row of A
    p.m *= p.batch;
    p.batch = 1;
    p.stride_a = 0;
  }
  gemm(p, a.data, b.data, y.data, nullptr, nullptr, stream_of(c));
}

// y (..., out) = x (..., in) W^T (+ b): one GEMM over every row of x, the bias in its epilogue. A fused
// activation (gelu) writes x W^T + b to output 1 and its GELU to output 0: in f16/bf16 through cuBLASLt's
// GELU epilogue, which is the tanh approximation and applies it to the f32 sums (before their rounding,
// which the unfused gelu would read), where the auxiliary output's leading dimension (out) is a multiple of
// 8 and cuBLASLt has an algorithm for it; else the GEMM, then the gelu kernel on the stored pre-activation,
// as linear and gelu unfused compute it. f32 always takes the latter: cuBLASLt does not document how exactly
// its epilogue computes tanh, and f32 results are held to the CPU's within 1e-5 (f16/bf16 ones to their
// rounding).
void linear(const KernelCtx& c) {
  const TensorView &x = c.in[0], &w = c.in[1], &y = c.out[0];
  const int64_t in = w.dim(1), out = w.dim(0);
  const void* bias = c.num_in == 3 ? c.in[2].data : nullptr;
  Problem p{y.dtype, false, true, bias != nullptr, false, x.numel() / in, out, in, 1, 0, 0};
  if (!c.attrs().has("activation")) {
    gemm(p, x.data, w.data, y.data, bias, nullptr, stream_of(c));
    return;
  }
  const TensorView& pre = c.out[1];
  const bool tanh = c.attrs().is("approximate", "tanh");
  if (tanh && out % 8 == 0 && y.dtype != DType::f32) {
    p.gelu = true;
    if (gemm(p, x.data, w.data, y.data, bias, pre.data, stream_of(c))) return;
    p.gelu = false;
  }
  gemm(p, x.data, w.data, pre.data, bias, nullptr, stream_of(c));
  unary(tanh ? UnaryOp::gelu_tanh : UnaryOp::gelu, storage_of(y.dtype), pre.data, y.data, y.numel(), 0.0f,
        stream_of(c));
}

}  // namespace flowrun::cuda
