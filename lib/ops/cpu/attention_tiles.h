// Pieces shared by the CPU flash-attention kernels (attention.cc for f32/f64, attention_bf16.cc for native
// bf16): block sizes, the vectorised exp and the row passes of the online softmax, which run on f32 or f64
// score tiles whatever the operands' type, and the geometry of one call (shapes, causal limits, padding).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "ops/registry.h"

namespace flowrun::cpu::attn {

constexpr int64_t kBQ = 64;  // query rows per block
constexpr int64_t kBK = 64;  // key rows per block

#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
#elif defined(__AVX__)
constexpr int kVecBytes = 32;
#else
constexpr int kVecBytes = 16;
#endif

// One SIMD register of T (GCC/Clang vector extension: element-wise arithmetic, scalars broadcast).
template <typename T>
struct Vec;
template <>
struct Vec<float> {
  typedef float type __attribute__((vector_size(kVecBytes)));
};
template <>
struct Vec<double> {
  typedef double type __attribute__((vector_size(kVecBytes)));
};

template <typename V, typename T>
inline V vload(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <typename V, typename T>
inline void vstore(T* p, V v) {
  std::memcpy(p, &v, sizeof(V));
}

template <typename T>
constexpr int64_t kLanes = kVecBytes / static_cast<int64_t>(sizeof(T));

// exp of one register, in place. f32: Cephes' expf (range reduction by ln 2, degree-6 polynomial, exponent
// bits built directly), branch-free; about 1 ulp, and exactly 0 below the f32 range (so -inf gives 0).
// f64 keeps std::exp per lane: that kernel is the accuracy reference, and speed matters in f32.
[[gnu::always_inline]] inline void exp_inplace(Vec<float>::type& x) {
  using V = Vec<float>::type;
  typedef int32_t VI __attribute__((vector_size(kVecBytes)));
  const V lo = V{} - 87.0f, hi = V{} + 88.0f, zero = V{};
  const V xc = x < lo ? lo : (x > hi ? hi : x);
  const V n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // +- 1.5 * 2^23 rounds to an integer
  V r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  V y = r * 1.9875691500e-4f + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const V pow2n = std::bit_cast<V>((__builtin_convertvector(n, VI) + 127) << 23);
  x = x < lo ? zero : y * pow2n;
}
inline void exp_inplace(Vec<double>::type& x) {
  for (int64_t l = 0; l < kLanes<double>; ++l) x[l] = std::exp(x[l]);
}

// The lanes of a register folded in halves (lane k with lane k + w, w = L/2, L/4, ..., 1): a fixed order, so
// the bits do not vary, in log2(L) dependent steps where a running sum or maximum over the lanes waited on
// L (a quarter of a 64-key row's exp pass). The halves stay in registers (`op` takes vectors and scalars
// alike): folding through an array in memory cost a fifth of the bf16 forward's time in two folds a row.
template <typename T, typename V, typename F>
[[gnu::always_inline]] inline T fold_lanes(V v, F op) {
  constexpr size_t L = sizeof(V) / sizeof(T);
  if constexpr (L == 1) {
    return v[0];
  } else if constexpr (L == 2) {
    return op(v[0], v[1]);
  } else {
    const auto half = [&]<size_t... I>(std::index_sequence<I...>, auto off) {
      return __builtin_shufflevector(v, v, (I + decltype(off)::value)...);
    };
    using Seq = std::make_index_sequence<L / 2>;
    return fold_lanes<T>(op(half(Seq{}, std::integral_constant<size_t, 0>{}),
                            half(Seq{}, std::integral_constant<size_t, L / 2>{})),
                         op);
  }
}

// The mask (as a comparison yields it) of the first `rem` lanes of a register of T.
template <typename T>
inline auto first_lanes(int64_t rem) {
  using V = typename Vec<T>::type;
  using I = decltype(V{} < V{});
  I v{};
  for (int64_t l = 0; l < kLanes<T>; ++l) v[l] = l;
  return v < static_cast<std::remove_reference_t<decltype(v[0])>>(rem);
}

// The row passes below read and write whole registers: `s` (and `ds`) is a row of a score tile kBK wide, so
// a partial register's tail stays inside the tile. Lanes past n are masked (their scores -inf), so the
// values and sums are those of the first n elements alone; what they store past n is 0 (or p * 0).

// max(init, s[0..n)).
template <typename T>
[[gnu::always_inline]] inline T row_max(const T* s, int64_t n, T init) {
  using V = typename Vec<T>::type;
  constexpr int64_t L = kLanes<T>;
  V vm = V{} + init;
  int64_t j = 0;
  for (; j + L <= n; j += L) {
    const V x = vload<V>(s + j);
    vm = x > vm ? x : vm;
  }
  if (j < n) {
    const V x = vload<V>(s + j);
    vm = first_lanes<T>(n - j) & (x > vm) ? x : vm;
  }
  return fold_lanes<T>(vm, [](auto a, auto b) { return a < b ? b : a; });  // std::max's choice
}

// s[j] = exp(s[j] - sub) for j < n; returns their sum (lane partial sums, then the lanes folded).
template <typename T>
[[gnu::always_inline]] inline T exp_sum(T* s, int64_t n, T sub) {
  using V = typename Vec<T>::type;
  constexpr int64_t L = kLanes<T>;
  V acc = V{};
  int64_t j = 0;
  for (; j + L <= n; j += L) {
    V x = vload<V>(s + j) - sub;
    exp_inplace(x);
    vstore(s + j, x);
    acc += x;
  }
  if (j < n) {  // the tail as one padded register: exp(-inf) = 0 adds nothing
    V x = first_lanes<T>(n - j) ? vload<V>(s + j) - sub : V{} - std::numeric_limits<T>::infinity();
    exp_inplace(x);
    vstore(s + j, x);
    acc += x;
  }
  return fold_lanes<T>(acc, [](auto a, auto b) { return a + b; });
}

// Backward row: p[j] = exp(p[j] - lse), ds[j] = p[j] * (ds[j] - di) * sc for j < n.
template <typename T>
[[gnu::always_inline]] inline void probs_and_ds(T* p, T* ds, int64_t n, T lse, T di, T sc) {
  using V = typename Vec<T>::type;
  constexpr int64_t L = kLanes<T>;
  int64_t j = 0;
  for (; j + L <= n; j += L) {
    V x = vload<V>(p + j) - lse;
    exp_inplace(x);
    vstore(p + j, x);
    vstore(ds + j, x * (vload<V>(ds + j) - di) * sc);
  }
  if (j < n) {
    const auto live = first_lanes<T>(n - j);
    V x = live ? vload<V>(p + j) - lse : V{} - std::numeric_limits<T>::infinity();
    exp_inplace(x);
    vstore(p + j, x);
    vstore(ds + j, live ? x * (vload<V>(ds + j) - di) * sc : V{});
  }
}

struct Geometry {
  int64_t bh, t, s, d, dv;
  int64_t off;  // S - T: query i sees keys j <= i + off under the causal mask (bottom-right aligned)
  bool causal;
  double scale;
  // Key padding (sdpa's optional key_ids, B x S): key j of batch b is hidden where key_ids[b * s + j] == pad.
  const int64_t* key_ids = nullptr;
  int64_t heads = 1, pad = 0;
  // Head h's batch row of key_ids, or null without padding.
  const int64_t* keys_of(int64_t h) const { return key_ids ? key_ids + h / heads * s : nullptr; }
  // One past the last key that query row i attends to.
  int64_t kv_end(int64_t i) const { return causal ? std::min(s, i + off + 1) : s; }
  // Keys of block [kb, kb + n) that each of the m rows from i0 attends to (non-decreasing down the rows).
  void limits(int64_t i0, int64_t m, int64_t kb, int64_t n, int64_t* lim) const {
    for (int64_t r = 0; r < m; ++r) lim[r] = std::clamp<int64_t>(kv_end(i0 + r) - kb, 0, n);
  }
  // For each key j < n of a block, the first of its m rows that attends to it (m where none does), from the
  // rows' limits: the backward's products over query rows start there.
  static void first_rows(const int64_t* lim, int64_t m, int64_t n, int64_t* first) {
    for (int64_t j = 0, r = 0; j < n; ++j) {
      while (r < m && lim[r] <= j) ++r;
      first[j] = r;
    }
  }
};

// The geometry of q (B,H,T,D), k (B,H,S,D), v (B,H,S,Dv) under the op's attributes, without key padding.
inline Geometry geometry(const Shape& q, const Shape& k, const Shape& v, const Attrs& a) {
  Geometry g;
  g.bh = q[0] * q[1];
  g.t = q[2];
  g.d = q[3];
  g.s = k[2];
  g.dv = v[3];
  g.off = g.s - g.t;
  g.causal = a.b("causal", true);
  g.scale = a.f("scale", 1.0 / std::sqrt(static_cast<double>(g.d)));
  return g;
}

// A call's geometry; key_ids: input `ids_at` when the node has it.
inline Geometry geometry(const KernelCtx& c, const TensorView& q, const TensorView& k, const TensorView& v,
                         int ids_at) {
  Geometry g = geometry(*q.shape, *k.shape, *v.shape, c.attrs());
  if (c.num_in > ids_at) {
    g.key_ids = c.in[ids_at].as<int64_t>();
    g.heads = q.dim(1);
    g.pad = c.attrs().i("pad_id");
  }
  return g;
}

// One (batch, head)'s operands in the forward: row 0 of its q, k, v and out, and their row strides (D or Dv
// in (B, H, T, D) tensors; 3 H D and H D for sdpa_qkv's packed rows and merged heads).
template <typename T>
struct HeadRows {
  const T *q, *k, *v;
  T* out;
  int64_t ldq, ldk, ldv, ldo;
};

// The row strides of one head's operands in the backward.
struct HeadStrides {
  int64_t q, k, v, o, dout, dq, dk, dv;
  // Those of (B, H, T, D) tensors.
  static HeadStrides dense(const Geometry& g) { return {g.d, g.d, g.dv, g.dv, g.dv, g.d, g.d, g.dv}; }
};

// sdpa_qkv's operands: qkv (B, T, 3 H D) rows holding q | k | v, each (H, D), under attr heads; out and dout
// (B, T, H D).
struct Packed {
  int64_t b, h, d, t;
  Packed(const Shape& qkv, const Attrs& a) : b(qkv[0]), h(a.i("heads")), d(qkv[2] / (3 * h)), t(qkv[1]) {}
  Packed(const KernelCtx& c, const TensorView& qkv) : Packed(*qkv.shape, c.attrs()) {}
  int64_t row() const { return 3 * h * d; }
  // Element offset of row 0 of part `which` (0 q, 1 k, 2 v) of head `bh` (batch-major) in qkv.
  int64_t part(int64_t bh, int which) const { return bh / h * t * row() + which * h * d + bh % h * d; }
  // ... and of head `bh`'s row 0 in out (or dout), whose rows are h d apart.
  int64_t merged(int64_t bh) const { return (bh / h * t * h + bh % h) * d; }
  // The backward's strides: q, k, v and their gradients in qkv rows, out and dout in merged rows.
  HeadStrides strides() const {
    const int64_t r = row(), m = h * d;
    return {r, r, r, m, m, r, r, r};
  }
  // The geometry of its (B, H, T, D) heads.
  Geometry geometry(const Attrs& a) const {
    const Shape head{b, h, t, d};
    return attn::geometry(head, head, head, a);
  }
};

// sdpa_rows' operands: the projections as the linears write them, q (B, T, H D), k (B, S, H D), v (B, S, H
// Dv) and out (B, T, H Dv) under attr heads: head h of a row is its columns [h D, (h + 1) D).
struct Rows {
  int64_t b, h, t, s, d, dv;
  Rows(const Shape& q, const Shape& k, const Shape& v, const Attrs& a)
      : b(q[0]), h(a.i("heads")), t(q[1]), s(k[1]), d(q[2] / h), dv(v[2] / h) {}
  // Element offsets of row 0 of head `bh` (batch-major) in q (or dq), k (dk), v (dv) and out (dout).
  int64_t q(int64_t bh) const { return (bh / h * t * h + bh % h) * d; }
  int64_t k(int64_t bh) const { return (bh / h * s * h + bh % h) * d; }
  int64_t v(int64_t bh) const { return (bh / h * s * h + bh % h) * dv; }
  int64_t o(int64_t bh) const { return (bh / h * t * h + bh % h) * dv; }
  HeadStrides strides() const { return {h * d, h * d, h * dv, h * dv, h * dv, h * d, h * d, h * dv}; }
  // The geometry of its (B, H, T, D) heads, with key_ids (B, S) where `ids` is not null.
  Geometry geometry(const Attrs& a, const int64_t* ids) const {
    Geometry g = attn::geometry(Shape{b, h, t, d}, Shape{b, h, s, d}, Shape{b, h, s, dv}, a);
    if (ids) {
      g.key_ids = ids;
      g.heads = h;
      g.pad = a.i("pad_id");
    }
    return g;
  }
};

}  // namespace flowrun::cpu::attn
