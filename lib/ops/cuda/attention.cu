// Scaled-dot-product attention on the device, tiled as FlashAttention-2: a thread block takes a tile of b
// query rows (b = 64, 32 or 16, the largest whose tiles fit kSmemBudget), walks the key/value tiles with the
// online softmax (running max and sum in f32) and writes out and lse; under the causal mask the key tiles
// nobody in the query tile sees are skipped. The backward recomputes the probabilities from lse: one kernel
// takes rowsum_i = dout_i . out_i, one a block per key tile summing dk and dv over the query tiles in order,
// one a block per query tile summing dq over the key tiles in order. Every output element is written by one
// block and every sum runs in a fixed order: no atomics, the same bits on every run.
//
// Matrix products of f16/bf16 tiles run on tensor cores (wmma m16n16k16, f32 accumulation); f32 ones on the
// SIMT cores (f32 is held to the CPU kernel within ~1e-5: no TF32). Tiles live in shared memory, zero-padded
// to multiples of 16 in every dimension (ragged lengths, head dims that are not multiples of 16);
// probabilities and dS are rounded to the input type before their products, as in FlashAttention.

#include <mma.h>

#include <cmath>

#include "ops/cuda/device.cuh"

namespace flowrun::cuda {

namespace {

using namespace device;
namespace wmma = nvcuda::wmma;

constexpr int kFrag = 16;  // wmma's m, n and k
// Dynamic shared memory a block may take: within the opt-in limits of sm_80 (163 KiB) and sm_90 (227 KiB).
constexpr size_t kSmemBudget = 160 * 1024;

int round_up(int64_t n, int m) {
  return static_cast<int>((n + m - 1) / m * m);
}

// A launch's tile geometry: b query (or key) rows per tile; d and dv rounded up to kFrag.
struct Tiles {
  int b, dp, dvp;
};

// Pitches (elements) of the shared tiles: operands of storage T skewed by 16 bytes (wmma wants multiples of
// 16 bytes, the skew spreads rows over the banks), f32 tiles by 4 floats (wmma: multiples of 4); for f32,
// whose products run on the SIMT cores, both by one element (odd pitches read a column without bank
// conflicts).
template <typename T>
struct Pitch {
  static constexpr int kOp = sizeof(T) == 4 ? 1 : 8;
  static constexpr int kAcc = sizeof(T) == 4 ? 1 : 4;
};

// Carves a block's dynamic shared memory: each piece 32-byte aligned (wmma's pointer alignment).
struct Carve {
  size_t bytes = 0;
  template <typename E>
  __host__ __device__ size_t take(int64_t n) {
    const size_t at = bytes;
    bytes = (at + static_cast<size_t>(n) * sizeof(E) + 31) / 32 * 32;
    return at;
  }
};

// The forward kernel's shared memory: q, k, v tiles, scores, probabilities, the out accumulator, and each
// query row's running max and sum.
template <typename T>
struct ForwardSmem {
  int ldd, ldv, lds, ldp, ldo;
  size_t q, k, v, s, p, o, m, l, bytes;
  __host__ __device__ explicit ForwardSmem(const Tiles& t)
      : ldd(t.dp + Pitch<T>::kOp),
        ldv(t.dvp + Pitch<T>::kOp),
        lds(t.b + Pitch<T>::kAcc),
        ldp(t.b + Pitch<T>::kOp),
        ldo(t.dvp + Pitch<T>::kAcc) {
    Carve c;
    q = c.take<T>(t.b * ldd);
    k = c.take<T>(t.b * ldd);
    v = c.take<T>(t.b * ldv);
    s = c.take<float>(t.b * lds);
    p = c.take<T>(t.b * ldp);
    o = c.take<float>(t.b * ldo);
    m = c.take<float>(t.b);
    l = c.take<float>(t.b);
    bytes = c.bytes;
  }
};

// The backward kernels' shared memory: q, dout, k, v tiles, scores and dP (f32), probabilities and dS (input
// type), each query row's lse and rowsum, and the f32 accumulators: dk and dv (the key-tile kernel, kDq
// false) or dq.
template <typename T, bool kDq>
struct BackwardSmem {
  int ldd, ldv, lds, ldp, ldk, ldvacc;
  size_t q, dout, k, v, s, dp, p, ds, lse, rowsum, dk_or_dq, dv, bytes;
  __host__ __device__ explicit BackwardSmem(const Tiles& t)
      : ldd(t.dp + Pitch<T>::kOp),
        ldv(t.dvp + Pitch<T>::kOp),
        lds(t.b + Pitch<T>::kAcc),
        ldp(t.b + Pitch<T>::kOp),
        ldk(t.dp + Pitch<T>::kAcc),
        ldvacc(t.dvp + Pitch<T>::kAcc) {
    Carve c;
    q = c.take<T>(t.b * ldd);
    dout = c.take<T>(t.b * ldv);
    k = c.take<T>(t.b * ldd);
    v = c.take<T>(t.b * ldv);
    s = c.take<float>(t.b * lds);
    dp = c.take<float>(t.b * lds);
    p = kDq ? 0 : c.take<T>(t.b * ldp);  // dq needs no probabilities, only dS
    ds = c.take<T>(t.b * ldp);
    lse = c.take<float>(t.b);
    rowsum = c.take<float>(t.b);
    dk_or_dq = c.take<float>(t.b * ldk);
    dv = kDq ? 0 : c.take<float>(t.b * ldvacc);
    bytes = c.bytes;
  }
};

// The keys query i of a head sees: [0, end).
__device__ __forceinline__ int64_t keys_seen(const Attention& a, int64_t i) {
  if (!a.causal) return a.s;
  const int64_t e = i + a.s - a.t + 1;
  return e < a.s ? e : a.s;
}

// Whether key j of head h is visible as far as the key padding goes.
__device__ __forceinline__ bool key_visible(const Attention& a, int64_t h, int64_t j) {
  return a.key_ids == nullptr || a.key_ids[h / a.heads * a.s + j] != a.pad_id;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Rows [0, rows) and columns [0, cols) of a row-major global matrix with `cols` columns into a (b x width)
// shared tile of pitch ld; zeros elsewhere.
template <typename T>
__device__ void load_tile(T* dst, int ld, const T* src, int64_t cols, int rows, int b, int width) {
  for (int e = threadIdx.x; e < b * width; e += kThreads) {
    const int r = e / width, c = e % width;
    if (r < rows && c < cols)
      dst[r * ld + c] = src[r * cols + c];
    else
      store(dst, r * ld + c, 0.0f);
  }
}

// C (m x n, f32, pitch ldc) = [C +] A B over shared tiles, by the whole block (every thread calls it; the
// caller synchronises around it). A is m x k, stored row-major, or k x m when kTransA (A = the stored
// matrix's transpose); B is k x n, or stored n x k when kTransB. m, n and k are multiples of kFrag. Each
// element of C is summed by one warp (tensor cores) or one thread (f32) in a fixed order.
template <typename T, bool kTransA, bool kTransB, bool kAccumulate>
__device__ void block_gemm(const T* a, int lda, const T* b, int ldb, float* c, int ldc, int m, int n, int k) {
  if constexpr (std::is_same_v<T, float>) {
    for (int e = threadIdx.x; e < m * n; e += kThreads) {
      const int i = e / n, j = e % n;
      float acc = kAccumulate ? c[i * ldc + j] : 0.0f;
      for (int x = 0; x < k; ++x)
        acc = fmaf(kTransA ? a[x * lda + i] : a[i * lda + x], kTransB ? b[j * ldb + x] : b[x * ldb + j], acc);
      c[i * ldc + j] = acc;
    }
  } else {
    using LayoutA = std::conditional_t<kTransA, wmma::col_major, wmma::row_major>;
    using LayoutB = std::conditional_t<kTransB, wmma::col_major, wmma::row_major>;
    const int tiles_n = n / kFrag;
    for (int t = threadIdx.x / 32; t < (m / kFrag) * tiles_n; t += kWarps) {
      const int i0 = t / tiles_n * kFrag, j0 = t % tiles_n * kFrag;
      wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float> acc;
      if (kAccumulate)
        wmma::load_matrix_sync(acc, c + i0 * ldc + j0, ldc, wmma::mem_row_major);
      else
        wmma::fill_fragment(acc, 0.0f);
      for (int x = 0; x < k; x += kFrag) {
        wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, T, LayoutA> fa;
        wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, T, LayoutB> fb;
        wmma::load_matrix_sync(fa, kTransA ? a + x * lda + i0 : a + i0 * lda + x, lda);
        wmma::load_matrix_sync(fb, kTransB ? b + j0 * ldb + x : b + x * ldb + j0, ldb);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(c + i0 * ldc + j0, acc, ldc, wmma::mem_row_major);
    }
  }
}

// Block (head h, query tile): out and lse of its rows. Tiles run from the last (under the causal mask, the
// ones with the most keys) to the first.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(Attention a, Tiles tl, const T* q, const T* k, const T* v, T* out, float* lse) {
  extern __shared__ __align__(128) unsigned char smem[];
  const ForwardSmem<T> L(tl);
  T* qs = reinterpret_cast<T*>(smem + L.q);
  T* ks = reinterpret_cast<T*>(smem + L.k);
  T* vs = reinterpret_cast<T*>(smem + L.v);
  float* ss = reinterpret_cast<float*>(smem + L.s);
  T* ps = reinterpret_cast<T*>(smem + L.p);
  float* os = reinterpret_cast<float*>(smem + L.o);
  float* ms = reinterpret_cast<float*>(smem + L.m);
  float* ls = reinterpret_cast<float*>(smem + L.l);
  const int b = tl.b, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t tiles = (a.t + b - 1) / b, h = blockIdx.x / tiles;
  const int64_t q0 = (tiles - 1 - blockIdx.x % tiles) * b;
  const int qr = static_cast<int>(a.t - q0 < b ? a.t - q0 : b);
  load_tile(qs, L.ldd, q + (h * a.t + q0) * a.d, a.d, qr, b, tl.dp);
  for (int e = threadIdx.x; e < b * L.ldo; e += kThreads) os[e] = 0.0f;
  for (int r = threadIdx.x; r < b; r += kThreads) {
    ms[r] = -INFINITY;
    ls[r] = 0.0f;
  }
  // Keys past those the tile's last row sees are masked for every row of it.
  const int64_t kend = keys_seen(a, q0 + qr - 1);
  for (int64_t k0 = 0; k0 < kend; k0 += b) {
    const int kr = static_cast<int>(a.s - k0 < b ? a.s - k0 : b);
    __syncthreads();  // the previous tile's products are done with k, v and p
    load_tile(ks, L.ldd, k + (h * a.s + k0) * a.d, a.d, kr, b, tl.dp);
    load_tile(vs, L.ldv, v + (h * a.s + k0) * a.dv, a.dv, kr, b, tl.dvp);
    __syncthreads();
    block_gemm<T, false, true, false>(qs, L.ldd, ks, L.ldd, ss, L.lds, b, b, tl.dp);
    __syncthreads();
    // Online softmax, a warp per row (two keys a lane): the row's new max, its probabilities, the sum and
    // out rescaled by exp(old max - new max). Padded rows (past t) see no key and keep max -inf, as do rows
    // whose keys so far are all key padding (their probabilities 0, sum 0).
    for (int r = warp; r < b; r += kWarps) {
      const int64_t end = r < qr ? keys_seen(a, q0 + r) : 0;
      float x[2], mx = -INFINITY;
      for (int u = 0; u < 2; ++u) {
        const int c = lane + 32 * u;
        x[u] = c < b && k0 + c < end && key_visible(a, h, k0 + c) ? a.scale * ss[r * L.lds + c] : -INFINITY;
        mx = fmaxf(mx, x[u]);
      }
      const float m_old = ms[r], m_new = fmaxf(m_old, warp_max(mx));
      float sum = 0.0f;
      for (int u = 0; u < 2; ++u) {
        const int c = lane + 32 * u;
        const float pu = x[u] == -INFINITY ? 0.0f : expf(x[u] - m_new);
        sum += pu;
        if (c < b) store(ps, r * L.ldp + c, pu);
      }
      sum = warp_sum(sum);
      const float alpha = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
      for (int c = lane; c < tl.dvp; c += 32) os[r * L.ldo + c] *= alpha;
      if (lane == 0) {
        ms[r] = m_new;
        ls[r] = ls[r] * alpha + sum;
      }
    }
    __syncthreads();
    block_gemm<T, false, false, true>(ps, L.ldp, vs, L.ldv, os, L.ldo, b, tl.dvp, b);
  }
  __syncthreads();
  // Every row up to t sees key 0, so its sum is positive, unless key padding hides every key it would see:
  // then out 0 and lse 0 (finite, as the CPU's).
  for (int e = threadIdx.x; e < qr * a.dv; e += kThreads) {
    const int r = e / a.dv, c = e % a.dv;
    store(out, (h * a.t + q0 + r) * a.dv + c, ls[r] > 0.0f ? os[r * L.ldo + c] / ls[r] : 0.0f);
  }
  for (int r = threadIdx.x; r < qr; r += kThreads)
    lse[h * a.t + q0 + r] = ls[r] > 0.0f ? ms[r] + logf(ls[r]) : 0.0f;
}

// rowsum_i = dout_i . out_i (FlashAttention-2's D_i), a warp per query row.
template <typename T>
__global__ void rowsum_kernel(int64_t rows, int64_t dv, const T* dout, const T* out, float* rowsum) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= rows) return;  // the whole warp: its shuffles stay among live lanes
  const int lane = threadIdx.x % 32;
  float acc = 0.0f;
  for (int64_t c = lane; c < dv; c += 32) acc += load(dout, row * dv + c) * load(out, row * dv + c);
  acc = warp_sum(acc);
  if (lane == 0) rowsum[row] = acc;
}

// Loads the query-side tiles of a backward block: q and dout rows [q0, q0 + qr) of head h, their lse and
// rowsum (0 on padded rows).
template <typename T, bool kDq>
__device__ void load_query_side(const Attention& a, const Tiles& tl, const BackwardSmem<T, kDq>& L,
                                unsigned char* smem, int64_t h, int64_t q0, int qr, const T* q, const T* dout,
                                const float* lse, const float* rowsum) {
  load_tile(reinterpret_cast<T*>(smem + L.q), L.ldd, q + (h * a.t + q0) * a.d, a.d, qr, tl.b, tl.dp);
  load_tile(reinterpret_cast<T*>(smem + L.dout), L.ldv, dout + (h * a.t + q0) * a.dv, a.dv, qr, tl.b, tl.dvp);
  for (int r = threadIdx.x; r < tl.b; r += kThreads) {
    reinterpret_cast<float*>(smem + L.lse)[r] = r < qr ? lse[h * a.t + q0 + r] : 0.0f;
    reinterpret_cast<float*>(smem + L.rowsum)[r] = r < qr ? rowsum[h * a.t + q0 + r] : 0.0f;
  }
}

// The (query tile q0, key tile k0) part of the backward once q, dout, k, v, lse and rowsum are in shared
// memory: scores and dP, then p_ij = exp(scale s_ij - lse_i) (0 where masked, padded or key padding) and
// ds_ij = p_ij (dP_ij - rowsum_i), rounded to T into L.p (when !kDq) and L.ds. Ends synchronised.
template <typename T, bool kDq>
__device__ void probabilities(const Attention& a, const Tiles& tl, const BackwardSmem<T, kDq>& L,
                              unsigned char* smem, int64_t h, int64_t q0, int64_t k0) {
  const T* qs = reinterpret_cast<const T*>(smem + L.q);
  const T* dos = reinterpret_cast<const T*>(smem + L.dout);
  const T* ks = reinterpret_cast<const T*>(smem + L.k);
  const T* vs = reinterpret_cast<const T*>(smem + L.v);
  float* ss = reinterpret_cast<float*>(smem + L.s);
  float* dps = reinterpret_cast<float*>(smem + L.dp);
  const float* lses = reinterpret_cast<const float*>(smem + L.lse);
  const float* rss = reinterpret_cast<const float*>(smem + L.rowsum);
  const int b = tl.b;
  block_gemm<T, false, true, false>(qs, L.ldd, ks, L.ldd, ss, L.lds, b, b, tl.dp);
  block_gemm<T, false, true, false>(dos, L.ldv, vs, L.ldv, dps, L.lds, b, b, tl.dvp);
  __syncthreads();
  for (int e = threadIdx.x; e < b * b; e += kThreads) {
    const int r = e / b, c = e % b;
    const int64_t i = q0 + r, j = k0 + c;
    const bool seen = i < a.t && j < keys_seen(a, i) && key_visible(a, h, j);
    const float p = seen ? expf(a.scale * ss[r * L.lds + c] - lses[r]) : 0.0f;
    if constexpr (!kDq) store(reinterpret_cast<T*>(smem + L.p), r * L.ldp + c, p);
    store(reinterpret_cast<T*>(smem + L.ds), r * L.ldp + c, p * (dps[r * L.lds + c] - rss[r]));
  }
  __syncthreads();
}

// Block (head h, key tile): dv_j = sum_i p_ij dout_i and dk_j = scale * sum_i ds_ij q_i over the query tiles
// that see the tile, in order. Tiles run from the first (under the causal mask, the most queries) on.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    dkv_kernel(Attention a, Tiles tl, const T* dout, const T* q, const T* k, const T* v, const float* lse,
               const float* rowsum, T* dk, T* dv) {
  extern __shared__ __align__(128) unsigned char smem[];
  const BackwardSmem<T, false> L(tl);
  float* dks = reinterpret_cast<float*>(smem + L.dk_or_dq);
  float* dvs = reinterpret_cast<float*>(smem + L.dv);
  const int b = tl.b;
  const int64_t tiles = (a.s + b - 1) / b, h = blockIdx.x / tiles, k0 = blockIdx.x % tiles * b;
  const int kr = static_cast<int>(a.s - k0 < b ? a.s - k0 : b);
  load_tile(reinterpret_cast<T*>(smem + L.k), L.ldd, k + (h * a.s + k0) * a.d, a.d, kr, b, tl.dp);
  load_tile(reinterpret_cast<T*>(smem + L.v), L.ldv, v + (h * a.s + k0) * a.dv, a.dv, kr, b, tl.dvp);
  for (int e = threadIdx.x; e < b * L.ldk; e += kThreads) dks[e] = 0.0f;
  for (int e = threadIdx.x; e < b * L.ldvacc; e += kThreads) dvs[e] = 0.0f;
  // Query i sees key j when j <= i + s - t: the first query that sees k0, from the start of its tile.
  const int64_t first = a.causal && k0 > a.s - a.t ? k0 - (a.s - a.t) : 0;
  for (int64_t q0 = first / b * b; q0 < a.t; q0 += b) {
    const int qr = static_cast<int>(a.t - q0 < b ? a.t - q0 : b);
    __syncthreads();  // the previous tile's products are done with q, dout, p and ds
    load_query_side(a, tl, L, smem, h, q0, qr, q, dout, lse, rowsum);
    __syncthreads();
    probabilities(a, tl, L, smem, h, q0, k0);
    // dv += p^T dout and dk += ds^T q (keys x queries times queries x dims).
    block_gemm<T, true, false, true>(reinterpret_cast<const T*>(smem + L.p), L.ldp,
                                     reinterpret_cast<const T*>(smem + L.dout), L.ldv, dvs, L.ldvacc, b,
                                     tl.dvp, b);
    block_gemm<T, true, false, true>(reinterpret_cast<const T*>(smem + L.ds), L.ldp,
                                     reinterpret_cast<const T*>(smem + L.q), L.ldd, dks, L.ldk, b, tl.dp, b);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kr * a.dv; e += kThreads) {
    const int r = e / a.dv, c = e % a.dv;
    store(dv, (h * a.s + k0 + r) * a.dv + c, dvs[r * L.ldvacc + c]);
  }
  for (int e = threadIdx.x; e < kr * a.d; e += kThreads) {
    const int r = e / a.d, c = e % a.d;
    store(dk, (h * a.s + k0 + r) * a.d + c, a.scale * dks[r * L.ldk + c]);
  }
}

// Block (head h, query tile): dq_i = scale * sum_j ds_ij k_j over the key tiles the tile sees, in order.
// Tiles run from the last (under the causal mask, the most keys) to the first.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    dq_kernel(Attention a, Tiles tl, const T* dout, const T* q, const T* k, const T* v, const float* lse,
              const float* rowsum, T* dq) {
  extern __shared__ __align__(128) unsigned char smem[];
  const BackwardSmem<T, true> L(tl);
  float* dqs = reinterpret_cast<float*>(smem + L.dk_or_dq);
  const int b = tl.b;
  const int64_t tiles = (a.t + b - 1) / b, h = blockIdx.x / tiles;
  const int64_t q0 = (tiles - 1 - blockIdx.x % tiles) * b;
  const int qr = static_cast<int>(a.t - q0 < b ? a.t - q0 : b);
  load_query_side(a, tl, L, smem, h, q0, qr, q, dout, lse, rowsum);
  for (int e = threadIdx.x; e < b * L.ldk; e += kThreads) dqs[e] = 0.0f;
  const int64_t kend = keys_seen(a, q0 + qr - 1);
  for (int64_t k0 = 0; k0 < kend; k0 += b) {
    const int kr = static_cast<int>(a.s - k0 < b ? a.s - k0 : b);
    __syncthreads();  // the previous tile's products are done with k, v and ds
    load_tile(reinterpret_cast<T*>(smem + L.k), L.ldd, k + (h * a.s + k0) * a.d, a.d, kr, b, tl.dp);
    load_tile(reinterpret_cast<T*>(smem + L.v), L.ldv, v + (h * a.s + k0) * a.dv, a.dv, kr, b, tl.dvp);
    __syncthreads();
    probabilities(a, tl, L, smem, h, q0, k0);
    // dq += ds k (queries x keys times keys x dims).
    block_gemm<T, false, false, true>(reinterpret_cast<const T*>(smem + L.ds), L.ldp,
                                      reinterpret_cast<const T*>(smem + L.k), L.ldd, dqs, L.ldk, b, tl.dp, b);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < qr * a.d; e += kThreads) {
    const int r = e / a.d, c = e % a.d;
    store(dq, (h * a.t + q0 + r) * a.d + c, a.scale * dqs[r * L.ldk + c]);
  }
}

// The largest tile (64, 32 or 16 rows) whose shared memory fits kSmemBudget; 16 always does for head dims up
// to kAttentionMaxHeadDim (the f32 key-tile kernel, the largest, takes ~100 KiB at 256).
template <typename Smem>
Tiles tiles_for(const Attention& a) {
  for (int b : {64, 32}) {
    const Tiles t{b, round_up(a.d, kFrag), round_up(a.dv, kFrag)};
    if (Smem(t).bytes <= kSmemBudget) return t;
  }
  return {16, round_up(a.d, kFrag), round_up(a.dv, kFrag)};
}

// Launches Kernel over `tiles` tiles of each of the a.bh heads with `smem` bytes of dynamic shared memory.
// Above 48 KiB needs the kernel's opt-in, set once to kSmemBudget: a process drives one device, chosen before
// any kernel runs (parallel/cuda/nccl.cc), and the first launch is the executor's warm-up, outside a capture.
template <auto Kernel, typename... Args>
void launch(size_t smem, int64_t tiles, const Attention& a, cudaStream_t s, Args... args) {
  static const bool opted_in = [] {
    check(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(kSmemBudget)),
          "cudaFuncSetAttribute (attention shared memory)");
    return true;
  }();
  (void)opted_in;
  Kernel<<<static_cast<unsigned>(a.bh * tiles), kThreads, smem, s>>>(args...);
}

}  // namespace

void sdpa(Storage st, const Attention& a, const void* q, const void* k, const void* v, void* out, float* lse,
          cudaStream_t s) {
  if (a.bh * a.t == 0) return;
  dispatch(st, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const Tiles tl = tiles_for<ForwardSmem<T>>(a);
    launch<forward_kernel<T>>(ForwardSmem<T>(tl).bytes, (a.t + tl.b - 1) / tl.b, a, s, a, tl,
                              static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                              static_cast<T*>(out), lse);
  });
  check(cudaGetLastError(), "sdpa kernel launch");
}

void sdpa_grad(Storage st, const Attention& a, const void* dout, const void* q, const void* k, const void* v,
               const void* out, const float* lse, void* dq, void* dk, void* dv, float* rowsum,
               cudaStream_t s) {
  if (a.bh * a.t == 0) return;
  dispatch(st, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto* dout_t = static_cast<const T*>(dout);
    const auto* q_t = static_cast<const T*>(q);
    const auto* k_t = static_cast<const T*>(k);
    const auto* v_t = static_cast<const T*>(v);
    const int64_t rows = a.bh * a.t;
    rowsum_kernel<<<static_cast<unsigned>((rows + kWarps - 1) / kWarps), kThreads, 0, s>>>(
        rows, a.dv, dout_t, static_cast<const T*>(out), rowsum);
    const Tiles kv = tiles_for<BackwardSmem<T, false>>(a);
    launch<dkv_kernel<T>>(BackwardSmem<T, false>(kv).bytes, (a.s + kv.b - 1) / kv.b, a, s, a, kv, dout_t, q_t,
                          k_t, v_t, lse, static_cast<const float*>(rowsum), static_cast<T*>(dk),
                          static_cast<T*>(dv));
    const Tiles qt = tiles_for<BackwardSmem<T, true>>(a);
    launch<dq_kernel<T>>(BackwardSmem<T, true>(qt).bytes, (a.t + qt.b - 1) / qt.b, a, s, a, qt, dout_t, q_t,
                         k_t, v_t, lse, static_cast<const float*>(rowsum), static_cast<T*>(dq));
  });
  check(cudaGetLastError(), "sdpa gradient kernel launch");
}

}  // namespace flowrun::cuda
