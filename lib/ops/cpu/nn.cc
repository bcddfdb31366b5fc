// CPU kernels of softmax/log_softmax, the losses, dropout and embedding: parallel over rows (or columns) with
// static chunks, reductions in a fixed lane order, so results are bitwise reproducible for any thread count.
#include "ops/cpu/nn.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ops/cpu/f8.h"
#include "ops/cpu/parallel.h"
#include "parallel/comm.h"

namespace flowrun::cpu {

namespace {

constexpr int64_t kGrain = 1 << 14;  // elements per task below which a loop runs inline
constexpr int kLanes = 16;           // independent partial sums: vectorisable and still a fixed order

// exp that the compiler can vectorise (std::exp is a scalar libm call without -ffast-math): Cody-Waite range
// reduction x = n ln2 + r, |r| <= ln2/2, a Taylor polynomial for e^r and 2^n built from the exponent bits.
// Within 2 ulp of std::exp; results below the smallest normal number are flushed to zero.
struct ExpF64 {
  static constexpr double lo = -708.0, hi = 709.0, log2e = 1.4426950408889634, shift = 0x1.8p52;
  static constexpr double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
};
struct ExpF32 {
  static constexpr float lo = -87.0f, hi = 88.0f, log2e = 1.44269504f, shift = 0x1.8p23f;
  static constexpr float ln2_hi = 0.693145751953125f, ln2_lo = 1.428606765330187045e-06f;
};

inline double vexp(double x) {
  using K = ExpF64;
  const bool under = x < K::lo;
  x = x < K::lo ? K::lo : x;
  x = x > K::hi ? K::hi : x;
  const double t = x * K::log2e + K::shift;  // n = round(x / ln2) sits in the low mantissa bits of t
  const double n = t - K::shift;
  const double r = (x - n * K::ln2_hi) - n * K::ln2_lo;
  // 1/k! for k = 13..0: the remainder r^14/14! is below 1e-17 for |r| <= ln2/2.
  double p = 1.6059043836821613e-10;
  p = p * r + 2.0876756987868098e-09;
  p = p * r + 2.5052108385441720e-08;
  p = p * r + 2.7557319223985893e-07;
  p = p * r + 2.7557319223985888e-06;
  p = p * r + 2.4801587301587302e-05;
  p = p * r + 1.9841269841269841e-04;
  p = p * r + 1.3888888888888889e-03;
  p = p * r + 8.3333333333333332e-03;
  p = p * r + 4.1666666666666664e-02;
  p = p * r + 1.6666666666666666e-01;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  const double scale = std::bit_cast<double>((std::bit_cast<uint64_t>(t) + 1023) << 52);
  return under ? 0.0 : p * scale;
}

// exp of f32 lanes, a float or an F8's 8 (f8.h), by the same operations (ExpF64's method, a degree-7
// polynomial). The F8 form serves the loops that called vexp per element and stayed scalar (perf on a Zen 3
// host: branches and scalar FMAs; cross entropy's two passes 1.9 ms of gpt-tiny's step); each lane runs the
// scalar function's operations in its order: the same bits (CrossEntropy.VectorExpsAreTheScalarOnes).
template <typename V, typename U>
inline V exp_f32(V x) {
  using K = ExpF32;
  const auto under = x < K::lo;
  x = x < K::lo ? V{} + K::lo : x;
  x = x > K::hi ? V{} + K::hi : x;
  const V t = x * K::log2e + K::shift;
  const V n = t - K::shift;
  const V r = (x - n * K::ln2_hi) - n * K::ln2_lo;
  V p = V{} + 1.98412698e-04f;  // 1/7!: the remainder r^8/8! is below 6e-9 for |r| <= ln2/2
  p = p * r + 1.38888889e-03f;
  p = p * r + 8.33333333e-03f;
  p = p * r + 4.16666667e-02f;
  p = p * r + 1.66666667e-01f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const V scale = std::bit_cast<V>((std::bit_cast<U>(t) + 127u) << 23);
  return under ? V{} : p * scale;
}
inline float vexp(float x) {
  return exp_f32<float, uint32_t>(x);
}
inline F8 vexp(F8 x) {
  return exp_f32<F8, U8>(x);
}

// lane_sum's finish: the tail from j on (element j + k to partial k), then the partials folded pairwise.
// Shared with row_lse<float>, whose whole blocks run in registers.
template <typename A, typename F>
inline A lane_sum_finish(A* acc, int64_t j, int64_t n, F f) {
  for (int k = 0; j + k < n; ++k) acc[k] += f(j + k);
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}
// sum_j f(j) for j in [0, n) as kLanes interleaved partial sums combined pairwise: the order depends on n
// only.
template <typename A, typename F>
inline A lane_sum(int64_t n, F f) {
  A acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += f(j + k);
  return lane_sum_finish(acc, j, n, f);
}

// row_max's finish: the tail from j on into the kLanes running maxima, then their maximum in order.
template <typename T>
inline T row_max_finish(T* acc, const T* x, int64_t j, int64_t n) {
  for (int k = 0; j + k < n; ++k) acc[k] = x[j + k] > acc[k] ? x[j + k] : acc[k];
  T m = acc[0];
  for (int k = 1; k < kLanes; ++k) m = acc[k] > m ? acc[k] : m;
  return m;
}

template <typename T>
inline T row_max(const T* x, int64_t n);
// row_max's 16 lanes as two registers of 8 over the whole blocks of 16, in f32: the same comparisons.
template <>
inline float row_max<float>(const float* x, int64_t n) {
  F8 a0 = F8{} + x[0], a1 = a0;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const F8 v0 = load8(x + j), v1 = load8(x + j + 8);
    a0 = v0 > a0 ? v0 : a0;
    a1 = v1 > a1 ? v1 : a1;
  }
  float acc[kLanes];
  store8(acc, a0);
  store8(acc + 8, a1);
  return row_max_finish(acc, x, j, n);
}
template <typename T>
inline T row_max(const T* x, int64_t n) {
  T acc[kLanes];
  std::fill_n(acc, kLanes, x[0]);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] = x[j + k] > acc[k] ? x[j + k] : acc[k];
  return row_max_finish(acc, x, j, n);
}

// log(sum(exp(x))) of one row, max-subtracted. Not inlined: log_softmax and cross_entropy run this very
// code, so a fused log_softmax + nll_loss gives bitwise the same loss as the unfused pair.
template <typename T>
[[gnu::noinline]] T row_lse(const T* x, int64_t n) {
  const T m = row_max(x, n);
  const T s = lane_sum<T>(n, [&](int64_t j) { return vexp(x[j] - m); });
  return m + std::log(s);
}
// The same in f32 with lane_sum's 16 partial sums as two registers of 8 over the whole blocks of 16 (lane
// k of the pair is partial sum k), the rest as lane_sum adds it: the same bits.
template <>
[[gnu::noinline]] float row_lse<float>(const float* x, int64_t n) {
  const float m = row_max(x, n);
  F8 a0{}, a1{};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    a0 += vexp(load8(x + j) - m);
    a1 += vexp(load8(x + j + 8) - m);
  }
  float acc[kLanes];
  store8(acc, a0);
  store8(acc + 8, a1);
  return m + std::log(lane_sum_finish(acc, j, n, [&](int64_t i) { return vexp(x[i] - m); }));
}

// dx[j] = g * vexp(x[j] - m) for j < n, 8 at a time where f32.
template <typename T>
void scaled_exps(const T* x, T m, T g, int64_t n, T* dx) {
  int64_t j = 0;
  if constexpr (std::is_same_v<T, float>)
    for (; j + 8 <= n; j += 8) store8(dx + j, g * vexp(load8(x + j) - m));
  for (; j < n; ++j) dx[j] = g * vexp(x[j] - m);
}

// f(r) for every row r of `rows` rows of `cols` elements, parallel over rows.
template <typename F>
void for_rows(int64_t rows, int64_t cols, F f) {
  parallel_for(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1)), [&](int64_t s, int64_t e) {
    for (int64_t r = s; r < e; ++r) f(r);
  });
}

// Row count and length of a (..., C) tensor viewed as (rows, C); rows = 0 when there is nothing to do.
struct Rows {
  int64_t rows, cols;
};
Rows rows_of(const TensorView& t) {
  const int64_t cols = t.rank() == 0 ? 1 : t.dim(-1);
  return {cols == 0 ? 0 : t.numel() / cols, cols};
}

bool in_range(int64_t label, int64_t classes) {
  return static_cast<uint64_t>(label) < static_cast<uint64_t>(classes);
}

// Positions that enter the mean: every label except ignore_index (out-of-range labels count, contributing 0).
int64_t count_targets(const int64_t* labels, int64_t rows, int64_t ignore) {
  int64_t n = 0;
  for (int64_t r = 0; r < rows; ++r) n += labels[r] != ignore;
  return n;
}

int64_t ignore_index(const KernelCtx& c) {
  return c.attrs().i("ignore_index", -100);
}

// The loss from the sum of its terms: over the count n of valid labels, or over cross_entropy's optional
// denominator (input `den`, a scalar of the logits' type T) where the node has one; 0 where that is 0.
template <typename T>
T class_loss(const KernelCtx& c, int den, double sum, int64_t n) {
  if (c.num_in > den) {
    const double d = static_cast<double>(c.in[den].as<T>()[0]);
    return d != 0.0 ? static_cast<T>(sum / d) : T(0);
  }
  return n > 0 ? static_cast<T>(sum / static_cast<double>(n)) : T(0);
}

// dloss over the same: the gradient's factor on every counted row (0 where the divisor is 0).
template <typename T>
T class_grad_scale(const KernelCtx& c, int den, T dloss, int64_t n) {
  if (c.num_in > den) {
    const T d = c.in[den].as<T>()[0];
    return d != T(0) ? dloss / d : T(0);
  }
  return n > 0 ? dloss / static_cast<T>(n) : T(0);
}

template <typename F>
void each_float(const KernelCtx& c, int input, F f) {
  dispatch_float(c.in[input].dtype, [&](auto* tag) { f(tag); });
}

}  // namespace

void softmax(const KernelCtx& c) {
  each_float(c, 0, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto [rows, C] = rows_of(c.in[0]);
    const T* x = c.in[0].as<T>();
    T* y = c.out[0].as<T>();
    for_rows(rows, C, [&](int64_t r) {
      const T* xr = x + r * C;
      T* yr = y + r * C;
      const T m = row_max(xr, C);
      for (int64_t j = 0; j < C; ++j) yr[j] = vexp(xr[j] - m);
      const T inv = T(1) / lane_sum<T>(C, [&](int64_t j) { return yr[j]; });
      for (int64_t j = 0; j < C; ++j) yr[j] *= inv;
    });
  });
}

void softmax_grad(const KernelCtx& c) {
  each_float(c, 0, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto [rows, C] = rows_of(c.in[0]);
    const T *dy = c.in[0].as<T>(), *y = c.in[1].as<T>();
    T* dx = c.out[0].as<T>();
    for_rows(rows, C, [&](int64_t r) {
      const T *dyr = dy + r * C, *yr = y + r * C;
      T* dxr = dx + r * C;
      const T s = lane_sum<T>(C, [&](int64_t j) { return dyr[j] * yr[j]; });
      for (int64_t j = 0; j < C; ++j) dxr[j] = yr[j] * (dyr[j] - s);
    });
  });
}

void log_softmax(const KernelCtx& c) {
  each_float(c, 0, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto [rows, C] = rows_of(c.in[0]);
    const T* x = c.in[0].as<T>();
    T* y = c.out[0].as<T>();
    for_rows(rows, C, [&](int64_t r) {
      const T* xr = x + r * C;
      T* yr = y + r * C;
      const T lse = row_lse(xr, C);
      for (int64_t j = 0; j < C; ++j) yr[j] = xr[j] - lse;
    });
  });
}

void log_softmax_grad(const KernelCtx& c) {
  each_float(c, 0, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto [rows, C] = rows_of(c.in[0]);
    const T *dy = c.in[0].as<T>(), *y = c.in[1].as<T>();
    T* dx = c.out[0].as<T>();
    for_rows(rows, C, [&](int64_t r) {
      const T *dyr = dy + r * C, *yr = y + r * C;
      T* dxr = dx + r * C;
      const T s = lane_sum<T>(C, [&](int64_t j) { return dyr[j]; });
      for (int64_t j = 0; j < C; ++j) dxr[j] = dyr[j] - vexp(yr[j]) * s;
    });
  });
}

// Loss terms are lse - x[label] (cross_entropy) and -(x[label] - lse) (nll_loss of log_softmax): the same
// rounded value. Both sum them in row order in double, so the fused and unfused losses agree bitwise.
// Logits split over the tensor axis by class (attrs offset: this rank's first class, classes: all of them):
// the row maxima, sums of exponentials and target logits are reduced over the axis's ranks (workspace: three
// doubles per row), so that every rank ends with the whole rows' lse and the loss.
template <typename T>
void cross_entropy_split(const KernelCtx& c, T* lse) {
  const auto [rows, C] = rows_of(c.in[0]);
  const T* x = c.in[0].as<T>();
  const int64_t* labels = c.in[1].as<int64_t>();
  const int64_t offset = c.attrs().i("offset"), classes = c.attrs().i("classes"), ignore = ignore_index(c);
  double* m = static_cast<double*>(c.workspace);
  double* sum = m + rows;
  double* target = sum + rows;
  for_rows(rows, C, [&](int64_t r) { m[r] = static_cast<double>(row_max(x + r * C, C)); });
  if (c.tp) c.tp->all_reduce(m, rows, DType::f64, ReduceOp::max);
  for_rows(rows, C, [&](int64_t r) {
    const T mr = static_cast<T>(m[r]);
    sum[r] = static_cast<double>(lane_sum<T>(C, [&](int64_t j) { return vexp(x[r * C + j] - mr); }));
    const int64_t l = labels[r] - offset;
    target[r] = l >= 0 && l < C ? static_cast<double>(x[r * C + l]) : 0.0;
  });
  if (c.tp) c.tp->all_reduce(sum, 2 * rows, DType::f64, ReduceOp::sum);
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    lse[r] = static_cast<T>(m[r] + std::log(sum[r]));
    const int64_t l = labels[r];
    if (l != ignore && in_range(l, classes)) total += static_cast<double>(lse[r]) - target[r];
  }
  const int64_t n = c.num_in > 2 ? 0 : count_targets(labels, rows, ignore);
  c.out[0].as<T>()[0] = class_loss<T>(c, 2, total, n);
}

void cross_entropy(const KernelCtx& c) {
  each_float(c, 0, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto [rows, C] = rows_of(c.in[0]);
    const T* x = c.in[0].as<T>();
    const int64_t* labels = c.in[1].as<int64_t>();
    T* lse = c.out[1].as<T>();
    if (c.attrs().has("classes")) return cross_entropy_split(c, lse);
    for_rows(rows, C, [&](int64_t r) { lse[r] = row_lse(x + r * C, C); });
    const int64_t ignore = ignore_index(c);
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t l = labels[r];
      if (l != ignore && in_range(l, C)) sum += static_cast<double>(lse[r] - x[r * C + l]);
    }
    const int64_t n = c.num_in > 2 ? 0 : count_targets(labels, rows, ignore);
    c.out[0].as<T>()[0] = class_loss<T>(c, 2, sum, n);
  });
}

void cross_entropy_grad(const KernelCtx& c) {
  each_float(c, 0, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto [rows, C] = rows_of(c.in[1]);
    const T* x = c.in[1].as<T>();
    const int64_t* labels = c.in[2].as<int64_t>();
    const T* lse = c.in[3].as<T>();
    T* dx = c.out[0].as<T>();
    const int64_t ignore = ignore_index(c);
    const bool den = c.num_in > 4;
    const int64_t n = den ? 0 : count_targets(labels, rows, ignore);
    const T g = class_grad_scale<T>(c, 4, c.in[0].as<T>()[0], n);
    // No row counts when the divisor is 0 (rather than dividing by it).
    const bool none = den ? c.in[4].as<T>()[0] == T(0) : n == 0;
    // Split over the tensor axis by class: this rank's columns of the whole rows (see cross_entropy_split).
    const int64_t offset = c.attrs().i("offset", 0), classes = c.attrs().i("classes", C);
    for_rows(rows, C, [&](int64_t r) {
      const int64_t l = labels[r];
      T* dxr = dx + r * C;
      if (l == ignore || !in_range(l, classes) || none) {
        std::fill_n(dxr, C, T(0));
        return;
      }
      const T* xr = x + r * C;
      const T m = lse[r];
      scaled_exps(xr, m, g, C, dxr);
      if (in_range(l - offset, C)) dxr[l - offset] -= g;
    });
  });
}

void nll_loss(const KernelCtx& c) {
  each_float(c, 0, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto [rows, C] = rows_of(c.in[0]);
    const T* logp = c.in[0].as<T>();
    const int64_t* labels = c.in[1].as<int64_t>();
    const int64_t ignore = ignore_index(c);
    double sum = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t l = labels[r];
      if (l != ignore && in_range(l, C)) sum -= static_cast<double>(logp[r * C + l]);
    }
    const int64_t n = count_targets(labels, rows, ignore);
    c.out[0].as<T>()[0] = n > 0 ? static_cast<T>(sum / static_cast<double>(n)) : T(0);
  });
}

void nll_loss_grad(const KernelCtx& c) {
  each_float(c, 0, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const auto [rows, C] = rows_of(c.in[1]);
    const int64_t* labels = c.in[2].as<int64_t>();
    T* dx = c.out[0].as<T>();
    const int64_t ignore = ignore_index(c);
    const int64_t n = count_targets(labels, rows, ignore);
    const T g = n > 0 ? c.in[0].as<T>()[0] / static_cast<T>(n) : T(0);
    for_rows(rows, C, [&](int64_t r) {
      T* dxr = dx + r * C;
      std::fill_n(dxr, C, T(0));
      const int64_t l = labels[r];
      if (l != ignore && in_range(l, C)) dxr[l] = -g;
    });
  });
}

void mse_loss(const KernelCtx& c) {
  each_float(c, 0, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T *p = c.in[0].as<T>(), *t = c.in[1].as<T>();
    const int64_t n = c.in[0].numel();
    const int64_t chunks = (n + kMseChunk - 1) / kMseChunk;
    // Fixed-size chunks (not per-thread ones) keep the summation order independent of the thread count.
    double* partial = static_cast<double*>(c.workspace);
    parallel_for(chunks, 4, [&](int64_t s, int64_t e) {
      for (int64_t k = s; k < e; ++k) {
        const T *pk = p + k * kMseChunk, *tk = t + k * kMseChunk;
        partial[k] = lane_sum<double>(std::min(kMseChunk, n - k * kMseChunk), [&](int64_t j) {
          const double d = static_cast<double>(pk[j]) - static_cast<double>(tk[j]);
          return d * d;
        });
      }
    });
    double sum = 0;
    for (int64_t k = 0; k < chunks; ++k) sum += partial[k];
    c.out[0].as<T>()[0] = n > 0 ? static_cast<T>(sum / static_cast<double>(n)) : T(0);
  });
}

// Element i is kept when uniform(i) >= p, uniform(i) being RngStream::uniform's value (24 bits of word i % 4
// of Philox block i / 4); one block serves four elements, and the mask depends on i only, never on threads.
void dropout(const KernelCtx& c) {
  each_float(c, 0, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const double p = c.attrs().f("p", 0.5);
    const T scale = p < 1.0 ? static_cast<T>(1.0 / (1.0 - p)) : T(0);
    const T* x = c.in[0].as<T>();
    T* y = c.out[0].as<T>();
    uint8_t* mask = c.out[1].as<uint8_t>();
    const int64_t n = c.in[0].numel();
    if (p <= 0.0) {
      if (y != x) std::copy(x, x + n, y);
      std::fill_n(mask, n, uint8_t{1});
      return;
    }
    const RngStream rng = c.rng;
    auto draw = [&](int64_t i, uint32_t word) {
      const float u = static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
      const bool keep = static_cast<double>(u) >= p;
      mask[i] = keep;
      y[i] = keep ? x[i] * scale : T(0);
    };
    // A piece of a tensor split over mesh axes (attrs rng_whole: the whole shape, rng_start: this piece's
    // first index on every axis) draws, for each element, the numbers of its index in the whole. A piece that
    // is one contiguous run of the whole (a batch split) starts at element o; others go row by row.
    // Micro-batch m of a step (KernelCtx::micro) comes after m whole micro-batches: its elements are
    // numbered from m * (elements of the whole).
    int64_t o = 0, micro_base = c.micro * n;
    bool contiguous = true;
    if (c.attrs().has("rng_whole")) {
      const std::vector<int64_t>& whole = c.attrs().ints("rng_whole");
      const std::vector<int64_t>& start = c.attrs().ints("rng_start");
      const Shape& local = *c.in[0].shape;
      size_t first = 0;  // the first axis holding more than one index: every later axis must be whole
      while (first + 1 < local.size() && local[first] == 1) ++first;
      int64_t stride = 1;
      for (size_t a = local.size(); a-- > 0;) {
        contiguous = contiguous && (a <= first || local[a] == whole[a]);
        o += start[a] * stride;
        stride *= whole[a];
      }
      micro_base = c.micro * stride;
    }
    o += micro_base;
    if (!contiguous) {
      const std::vector<int64_t>& whole = c.attrs().ints("rng_whole");
      const std::vector<int64_t>& start = c.attrs().ints("rng_start");
      const Shape& local = *c.in[0].shape;
      const size_t rank = local.size();
      const int64_t len = local.back(), rows = len > 0 ? n / len : 0;
      parallel_for(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(len, 1)), [&](int64_t s, int64_t e) {
        for (int64_t row = s; row < e; ++row) {
          int64_t g = micro_base + start[rank - 1], stride = whole[rank - 1], rem = row;
          for (size_t a = rank - 1; a-- > 0;) {
            g += (start[a] + rem % local[a]) * stride;
            rem /= local[a];
            stride *= whole[a];
          }
          std::array<uint32_t, 4> w = rng.block(static_cast<uint64_t>(g / 4));
          for (int64_t j = 0; j < len; ++j, ++g) {
            if (j > 0 && g % 4 == 0) w = rng.block(static_cast<uint64_t>(g / 4));
            draw(row * len + j, w[static_cast<size_t>(g % 4)]);
          }
        }
      });
      return;
    }
    // Element i uses word (o + i) % 4 of Philox block (o + i) / 4: a rank holding a slice of the batch draws
    // what one process would for those elements. Blocks are processed whole, so the loop runs over the
    // global blocks this slice touches.
    const int64_t first = o / 4, last = (o + n + 3) / 4;
    parallel_for(last - first, kGrain / 4, [&](int64_t s, int64_t e) {
      for (int64_t b = first + s; b < first + e; ++b) {
        const std::array<uint32_t, 4> w = rng.block(static_cast<uint64_t>(b));
        for (int64_t k = 0; k < 4; ++k) {
          const int64_t i = 4 * b + k - o;
          if (i < 0 || i >= n) continue;
          draw(i, w[static_cast<size_t>(k)]);
        }
      }
    });
  });
}

void dropout_grad(const KernelCtx& c) {
  each_float(c, 0, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const double p = c.attrs().f("p", 0.5);
    const T scale = p < 1.0 ? static_cast<T>(1.0 / (1.0 - p)) : T(0);
    const T* dy = c.in[0].as<T>();
    const uint8_t* mask = c.in[1].as<uint8_t>();
    T* dx = c.out[0].as<T>();
    parallel_for(c.in[0].numel(), kGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) dx[i] = mask[i] ? dy[i] * scale : T(0);
    });
  });
}

// BERT's masking. Element e of the step's whole batch (numbered as dropout numbers it: micro-batch m after m
// whole micro-batches, a piece of a split tensor by its index in the whole) reads the four words of Philox
// block e: word 0 selects it (uniform < p), word 1 picks the outcome (< mask_p: mask_id, < mask_p + random_p:
// a random token, else kept), words 2 and 3 the random token (their 64 bits mod vocab). `fixed` keys the
// stream on step 0 whatever the step is. The CUDA kernel (ops/cuda/random.cu) draws the same.
// Output 2, the count: the selection of element g depends on g alone (word 0 of block g), so every piece
// draws word 0 of every block of the step's whole batch, [0, whole elements * micro_batches), and counts the
// selected (an integer, whatever the threads), then keeps its share local / (whole * micro_batches) of it.
void mlm_mask(const KernelCtx& c) {
  const Attrs& a = c.attrs();
  const double p = a.f("p", 0.15), mask_p = a.f("mask_p", 0.8), keep_above = mask_p + a.f("random_p", 0.1);
  const int64_t vocab = a.i("vocab"), mask_id = a.i("mask_id");
  const RngStream rng = a.b("fixed", false) ? RngStream{c.rng.seed, mix_stream(0, c.node_stream)} : c.rng;
  const int64_t* ids = c.in[0].as<int64_t>();
  int64_t* out = c.out[0].as<int64_t>();
  int64_t* labels = c.out[1].as<int64_t>();
  const Shape& local = *c.in[0].shape;
  const size_t rank = local.size();
  const std::vector<int64_t> whole = a.has("rng_whole") ? a.ints("rng_whole") : local;
  const std::vector<int64_t> start = a.has("rng_start") ? a.ints("rng_start") : std::vector<int64_t>(rank, 0);
  int64_t whole_n = 1;
  for (int64_t d : whole) whole_n *= d;
  const int64_t base = c.micro * whole_n;
  auto uniform = [](uint32_t w) {
    return static_cast<double>(static_cast<float>(w >> 8) * (1.0f / 16777216.0f));
  };
  const int64_t micro_batches = a.i("micro_batches", 1), step_n = whole_n * micro_batches;
  std::atomic<int64_t> selected{0};
  parallel_for(step_n, kGrain / 2, [&](int64_t s, int64_t e) {
    int64_t k = 0;
    for (int64_t g = s; g < e; ++g) k += uniform(rng.block(static_cast<uint64_t>(g))[0]) < p;
    selected += k;
  });
  c.out[2].as<float>()[0] =
      step_n > 0 ? static_cast<float>(static_cast<double>(selected.load()) *
                                      static_cast<double>(c.in[0].numel()) / static_cast<double>(step_n))
                 : 0.0f;
  parallel_for(c.in[0].numel(), kGrain / 8, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) {
      int64_t g = base, stride = 1, rem = i;
      for (size_t ax = rank; ax-- > 0;) {
        g += (start[ax] + rem % local[ax]) * stride;
        rem /= local[ax];
        stride *= whole[ax];
      }
      const std::array<uint32_t, 4> w = rng.block(static_cast<uint64_t>(g));
      const int64_t id = ids[i];
      if (uniform(w[0]) >= p) {
        out[i] = id;
        labels[i] = -100;
        continue;
      }
      labels[i] = id;
      const double u = uniform(w[1]);
      const uint64_t bits = (static_cast<uint64_t>(w[3]) << 32) | w[2];
      out[i] = u < mask_p       ? mask_id
               : u < keep_above ? static_cast<int64_t>(bits % static_cast<uint64_t>(vocab))
                                : id;
    }
  });
}

// Ids outside [offset, offset + V) read nothing: their rows of the output are zeros (attr offset: the first
// row of a vocabulary split over the tensor axis).
void embedding(const KernelCtx& c) {
  each_float(c, 1, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const int64_t* ids = c.in[0].as<int64_t>();
    const T* table = c.in[1].as<T>();
    const int64_t V = c.in[1].dim(0), D = c.in[1].dim(1), n = c.in[0].numel();
    T* y = c.out[0].as<T>();
    const int64_t offset = c.attrs().i("offset", 0);
    for_rows(n, D, [&](int64_t i) {
      const int64_t id = ids[i] - offset;
      if (in_range(id, V))
        std::copy(table + id * D, table + (id + 1) * D, y + i * D);
      else
        std::fill_n(y + i * D, D, T(0));
    });
  });
}

// Scatter-add without atomics: each thread owns a contiguous block of the D columns of every table row and
// walks all ids in order, so every sum is accumulated in id order whatever the thread count. Ids outside
// [0, V) are skipped.
void embedding_grad(const KernelCtx& c) {
  each_float(c, 0, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* dy = c.in[0].as<T>();
    const int64_t* ids = c.in[1].as<int64_t>();
    T* dt = c.out[0].as<T>();
    const int64_t V = c.out[0].dim(0), D = c.out[0].dim(1), n = c.in[1].numel();
    const int64_t offset = c.attrs().i("offset", 0);
    const bool small = (V + n) * D <= kGrain;
    parallel_for(D, small ? D : 8, [&](int64_t d0, int64_t d1) {
      for (int64_t v = 0; v < V; ++v) std::fill(dt + v * D + d0, dt + v * D + d1, T(0));
      for (int64_t i = 0; i < n; ++i) {
        const int64_t id = ids[i] - offset;
        if (!in_range(id, V)) continue;
        T* dst = dt + id * D;
        const T* src = dy + i * D;
        for (int64_t d = d0; d < d1; ++d) dst[d] += src[d];
      }
    });
  });
}

}  // namespace flowrun::cpu
