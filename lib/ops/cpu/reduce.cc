// Reductions. The input is viewed as alternating kept/reduced dimension groups; each reduced group is an
// (outer, reduced, inner) reduction done in a fixed order (a contiguous row in 16 lanes, see lane_sum),
// parallel over outputs only, so sums are bitwise reproducible for any thread count.
#include "ops/cpu/reduce.h"

#include <algorithm>
#include <array>
#include <limits>

#include "ops/cpu/conv.h"
#include "ops/cpu/elementwise.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/prefetch.h"

namespace flowrun::cpu {

namespace {

enum class Kind { sum, max };

struct Group {
  int64_t size;
  bool reduced;
};

// At most 8 dims: fixed arrays keep the kernels free of heap allocation.
struct Groups {
  std::array<Group, 8> g{};
  int n = 0;
};

// Merge adjacent dims of the same kind, dropping size-1 dims.
Groups groups_of(const Shape& s, const std::vector<int64_t>& raw_axes) {
  FR_CHECK(s.size() <= 8, "rank ", s.size(), " is not supported");
  std::array<bool, 8> red{};
  red.fill(raw_axes.empty());
  for (int64_t a : raw_axes) red[static_cast<size_t>(normalize_axis(a, s.size()))] = true;
  Groups out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == 1) continue;
    if (out.n > 0 && out.g[static_cast<size_t>(out.n - 1)].reduced == red[i]) out.g[static_cast<size_t>(out.n - 1)].size *= s[i];
    else out.g[static_cast<size_t>(out.n++)] = {s[i], red[i]};
  }
  return out;
}

// sum_{r<n} row[r] in kLanes lanes (element r into lane r % kLanes), folded pairwise in a fixed order: the
// loop vectorises without -ffast-math, where one running sum waited on each add's latency (a conv bias
// gradient's sum over H x W took 8% of the bench CNN's step), and the order stays fixed.
constexpr int kLanes = 16;
template <typename S>
Compute<S> lane_sum(const S* row, int64_t n) {
  using T = Compute<S>;
  T acc[kLanes] = {};
  int64_t r = 0;
  for (; r + kLanes <= n; r += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += ld(row[r + k]);
  for (int k = 0; r + k < n; ++k) acc[k] += ld(row[r + k]);
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}

// y[a, k] = reduce_r x[a, r, k], x stored as S (bf16 is loaded to f32), y in the compute type T. `spare`
// (spare_elems of T, overlapping neither x nor y) holds the partials of a long reduction.
template <typename S, typename T>
void reduce3(Kind kind, const S* x, T* y, int64_t outer, int64_t red, int64_t inner, T* spare,
             int64_t spare_elems) {
  if (inner == 1) {
    parallel_for(outer, 256, [&](int64_t s, int64_t e) {
      for (int64_t a = s; a < e; ++a) {
        const S* row = x + a * red;
        if (kind == Kind::sum) {
          y[a] = lane_sum(row, red);
          continue;
        }
        T acc = ld(row[0]);
        for (int64_t r = 1; r < red; ++r) acc = std::max(acc, ld(row[r]));
        y[a] = acc;
      }
    });
    return;
  }
  // Tasks of (outer, column block, chunk of rows); each chunk's rows are accumulated in order into its own
  // block of partials (vectorises), then the chunks are combined in order. The chunks are fixed by the row
  // count, not the thread count, so the bits are the same on any thread count. Chunks let a linear's bias
  // gradient (2048 rows of 256 columns: one column block) run on every thread instead of one.
  constexpr int64_t kBlock = 256;
  const int64_t blocks = (inner + kBlock - 1) / kBlock;
  // (With one outer row, as a bias gradient has, the spare half of the workspace always holds the chunks.)
  int64_t chunks = reduce_row_chunks(red);
  if (chunks > 1 && outer * chunks * inner > spare_elems) chunks = 1;
  auto rows_of = [&](int64_t ch) { return std::pair{ch * red / chunks, (ch + 1) * red / chunks}; };
  parallel_for(outer * blocks * chunks, 1, [&](int64_t s, int64_t e) {
    for (int64_t t = s; t < e; ++t) {
      const int64_t ch = t % chunks, b = t / chunks % blocks, a = t / chunks / blocks;
      const int64_t k0 = b * kBlock, k1 = std::min(inner, k0 + kBlock);
      const auto [r0, r1] = rows_of(ch);
      T* out = chunks == 1 ? y + a * inner : spare + (a * chunks + ch) * inner;
      const S* base = x + a * red * inner;
      for (int64_t k = k0; k < k1; ++k) out[k] = ld(base[r0 * inner + k]);
      // Each row asks for its column block kAheadRows rows on (prefetch.h): gpt-tiny's bias gradients took
      // 0.97 ms of its step instead of 1.22 (three profiled runs of each build, alternating).
      constexpr int64_t kAheadRows = 4;
      for (int64_t r = r0 + 1; r < r1; ++r) {
        const S* row = base + r * inner;
        prefetch_span(reinterpret_cast<std::uintptr_t>(row + k0) + kAheadRows * inner * sizeof(S),
                      static_cast<size_t>(k1 - k0) * sizeof(S));
        if (kind == Kind::sum)
          for (int64_t k = k0; k < k1; ++k) out[k] += ld(row[k]);
        else
          for (int64_t k = k0; k < k1; ++k) out[k] = std::max(out[k], ld(row[k]));
      }
    }
  });
  if (chunks == 1) return;
  parallel_for(outer * inner, 4096, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e;) {
      const int64_t a = i / inner, k0 = i % inner, k1 = std::min(inner, k0 + (e - i));
      T* out = y + a * inner;
      const T* p = spare + a * chunks * inner;
      for (int64_t k = k0; k < k1; ++k) out[k] = p[k];
      for (int64_t ch = 1; ch < chunks; ++ch) {
        const T* q = p + ch * inner;
        if (kind == Kind::sum)
          for (int64_t k = k0; k < k1; ++k) out[k] += q[k];
        else
          for (int64_t k = k0; k < k1; ++k) out[k] = std::max(out[k], q[k]);
      }
      i += k1 - k0;
    }
  });
}

// The sum over (N, H, W) of an nChw{L}c x (attr `blocked`, L = 16, or 8 with attr `nchw8c`;
// graph/layout.cc: a convolution's bias gradient) into dst[C], in the plain kernel's order: per (n, c)
// lane_sum's lanes over H x W and their pairwise fold, the L channels of a block side by side; then the sum
// over n in order. t holds N x C partial sums.
template <typename S, int64_t L>
void channel_sum_blocked(const S* x, Compute<S>* t, Compute<S>* dst, int64_t n, int64_t c, int64_t hw) {
  using T = Compute<S>;
  const int64_t cb = c / L;
  parallel_for(n * cb, 1, [&](int64_t s, int64_t e) {
    for (int64_t p = s; p < e; ++p) {
      const S* v = x + p * hw * L;
      T acc[kLanes][L] = {};
      int64_t r = 0;
      for (; r + kLanes <= hw; r += kLanes)
        for (int k = 0; k < kLanes; ++k)
#pragma omp simd
          for (int l = 0; l < L; ++l) acc[k][l] += ld(v[(r + k) * L + l]);
      for (int k = 0; r + k < hw; ++k)
#pragma omp simd
        for (int l = 0; l < L; ++l) acc[k][l] += ld(v[(r + k) * L + l]);
      for (int w = kLanes / 2; w > 0; w /= 2)
        for (int k = 0; k < w; ++k)
#pragma omp simd
          for (int l = 0; l < L; ++l) acc[k][l] += acc[k + w][l];
      // p = image * cb + block, so t[image, block * L + l] is t[p * L + l].
      std::copy(acc[0], acc[0] + L, t + p * L);
    }
  });
  std::copy(t, t + c, dst);
  for (int64_t i = 1; i < n; ++i)
    for (int64_t k = 0; k < c; ++k) dst[k] += t[i * c + k];
}

// S is the storage type, T = Compute<S> the accumulator. f32/f64 write the last stage straight into y; bf16
// keeps every stage (and the mean's scaling) in f32 in the workspace and rounds each output once at the end,
// so it sums exactly as the f32 kernel does on the widened input.
template <typename S>
void reduce_kernel(const KernelCtx& c, Kind kind, bool mean) {
  using T = Compute<S>;
  constexpr bool direct = std::is_same_v<S, T>;
  const S* x = c.in[0].as<S>();
  S* y = c.out[0].as<S>();
  const int64_t n = c.in[0].numel(), m = c.out[0].numel();
  Groups gs = groups_of(*c.in[0].shape, c.attrs().ints_or_empty("axes"));
  auto& g = gs.g;
  const auto end = g.begin() + gs.n;
  // out_dtype f32 on bf16 (ops/registry.h result_dtype): the f32 result, not rounded.
  float* wide = !direct && c.out[0].dtype == DType::f32 ? c.out[0].as<float>() : nullptr;
  if (std::none_of(g.begin(), end, [](const Group& q) { return q.reduced; })) {
    // Nothing reduced: the mean's scale is 1.
    if (wide)
      for (int64_t i = 0; i < n; ++i) wide[i] = ld(x[i]);
    else
      std::copy(x, x + n, y);
    return;
  }
  // Reduce the last reduced group first, ping-ponging through the two halves of the workspace.
  T* ws = static_cast<T*>(c.workspace);
  FR_CHECK(c.workspace_bytes >= static_cast<size_t>(n) * sizeof(T), "reduce workspace too small");
  const T* src = nullptr;
  int flip = 0;
  const Shape& xs = *c.in[0].shape;
  if (c.attrs().b("blocked")) {
    FR_CHECK(kind == Kind::sum && sums_per_channel(xs, c.attrs().ints_or_empty("axes")) &&
                 xs[1] % PixelBlocks(xs[1], c.attrs()).lanes == 0,
             "a blocked reduction sums an (N, C, H, W) tensor over N, H and W, C in multiples of its block");
  }
  if (c.attrs().b("blocked") && xs[2] * xs[3] > 1) {  // with H x W = 1 both layouts are the same bytes
    T* dst = ws + n / 2;
    if constexpr (direct) dst = y;
    PixelBlocks(xs[1], c.attrs()).with_lanes([&](auto lanes) {
      channel_sum_blocked<S, decltype(lanes)::value>(x, ws, dst, xs[0], xs[1], xs[2] * xs[3]);
    });
    src = dst;
    gs.n = 0;  // done: only the scaling and rounding below remain
  }
  for (int gi = gs.n - 1; gi >= 0; --gi) {
    if (!g[static_cast<size_t>(gi)].reduced) continue;
    int64_t outer = 1, inner = 1;
    for (int j = 0; j < gi; ++j) outer *= g[static_cast<size_t>(j)].size;
    for (int j = gi + 1; j < gs.n; ++j) inner *= g[static_cast<size_t>(j)].size;
    const bool last = std::none_of(g.begin(), g.begin() + gi, [](const Group& q) { return q.reduced; });
    T* dst = ws + (flip++ % 2) * (n / 2);
    if constexpr (direct)
      if (last) dst = y;
    // The workspace half that neither src nor dst is in, or all of it when neither is in the workspace.
    auto in_ws = [&](const T* p) { return p && p >= ws && p < ws + n; };
    T* spare = nullptr;
    int64_t spare_elems = 0;
    if (!in_ws(src) && !in_ws(dst)) {
      spare = ws;
      spare_elems = n;
    } else if (!in_ws(src) || !in_ws(dst)) {
      const T* used = in_ws(src) ? src : dst;
      spare = used == ws ? ws + n / 2 : ws;
      spare_elems = n / 2;
    }
    if (src)
      reduce3<T, T>(kind, src, dst, outer, g[static_cast<size_t>(gi)].size, inner, spare, spare_elems);
    else
      reduce3<S, T>(kind, x, dst, outer, g[static_cast<size_t>(gi)].size, inner, spare, spare_elems);
    g[static_cast<size_t>(gi)].size = 1;
    src = dst;
  }
  const T scale = mean ? T(1) / static_cast<T>(n / std::max<int64_t>(m, 1)) : T(1);
  if constexpr (direct) {
    if (mean)
      for (int64_t i = 0; i < m; ++i) y[i] *= scale;
  } else {
    for (int64_t i = 0; i < m; ++i) {
      const T v = mean ? src[i] * scale : src[i];
      if (wide)
        wide[i] = v;
      else
        y[i] = st<S>(v);
    }
  }
}

// Strides of `small` (right-aligned against `big`, 1 where broadcast) as offsets into a contiguous `small`.
std::array<int64_t, 8> broadcast_strides(const Shape& small, const Shape& big) {
  std::array<int64_t, 8> st{};
  int64_t s = 1;
  for (size_t k = 0; k < big.size(); ++k) {
    const size_t axis = big.size() - 1 - k;
    const int64_t d = k < small.size() ? small[small.size() - 1 - k] : 1;
    st[axis] = d == 1 ? 0 : s;
    s *= d;
  }
  return st;
}

// Calls f(i, j) for every element i of `big` with j = sum(idx * st), its source index in a smaller tensor;
// `grain` elements of big at least per task.
template <typename F>
void for_each_broadcast(const std::array<int64_t, 8>& st, const Shape& big, F f, int64_t grain = 1 << 14) {
  FR_CHECK(big.size() <= 8, "rank ", big.size(), " is not supported");
  const int64_t n = numel(big);
  const size_t r = big.size();
  parallel_for(n, grain, [&](int64_t s, int64_t e) {
    std::array<int64_t, 8> idx{};
    int64_t rem = s, j = 0;
    for (size_t k = r; k-- > 0;) {
      idx[k] = rem % big[k];
      rem /= big[k];
      j += idx[k] * st[k];
    }
    for (int64_t i = s; i < e; ++i) {
      f(i, j);
      for (size_t k = r; k-- > 0;) {
        j += st[k];
        if (++idx[k] < big[k]) break;
        j -= st[k] * big[k];
        idx[k] = 0;
      }
    }
  });
}

// Strides into the reduced tensor (viewed with keepdims) for each axis of x: 0 along reduced axes.
std::array<int64_t, 8> reduced_strides(const Shape& x, const std::vector<int64_t>& axes) {
  FR_CHECK(x.size() <= 8, "rank ", x.size(), " is not supported");
  std::array<bool, 8> red{};
  red.fill(axes.empty());
  for (int64_t a : axes) red[static_cast<size_t>(normalize_axis(a, x.size()))] = true;
  std::array<int64_t, 8> st{};
  int64_t s = 1;
  for (size_t k = x.size(); k-- > 0;) {
    st[k] = red[k] || x[k] == 1 ? 0 : s;
    if (!red[k]) s *= x[k];
  }
  return st;
}

}  // namespace

bool sums_per_channel(const Shape& x, const std::vector<int64_t>& axes) {
  if (x.size() != 4 || axes.size() != 3) return false;
  std::array<bool, 4> red{};
  for (int64_t a : axes) red[static_cast<size_t>(normalize_axis(a, 4))] = true;
  return red[0] && !red[1] && red[2] && red[3];
}

void reduce_sum(const KernelCtx& c) {
  dispatch_storage(c.in[0].dtype, [&](auto* t) { reduce_kernel<std::remove_pointer_t<decltype(t)>>(c, Kind::sum, false); });
}
void reduce_mean(const KernelCtx& c) {
  dispatch_storage(c.in[0].dtype, [&](auto* t) { reduce_kernel<std::remove_pointer_t<decltype(t)>>(c, Kind::sum, true); });
}
void reduce_max(const KernelCtx& c) {
  dispatch_storage(c.in[0].dtype, [&](auto* t) { reduce_kernel<std::remove_pointer_t<decltype(t)>>(c, Kind::max, false); });
}

void reduce_max_grad(const KernelCtx& c) {
  // inputs: dy (reduced), x, y (reduced); output dx shaped like x.
  const Shape& xs = *c.in[1].shape;
  const auto strides = reduced_strides(xs, c.attrs().ints_or_empty("axes"));
  dispatch_storage(c.in[1].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T *dy = c.in[0].as<T>(), *x = c.in[1].as<T>(), *y = c.in[2].as<T>();
    T* dx = c.out[0].as<T>();
    for_each_broadcast(strides, xs, [&](int64_t i, int64_t j) { dx[i] = ld(x[i]) == ld(y[j]) ? dy[j] : T{}; });
  });
}

// The trailing axes of y merge into runs, all broadcast (a fill: a pooled gradient's planes) or all
// contiguous (a copy: a bias's rows), and the odometer steps once per run: element by element, the
// gradient of ResNet-20's global average pool (64 x 64 planes of 8 x 8) took 0.3 ms.
void broadcast_to(const KernelCtx& c) {
  const Shape& big = *c.out[0].shape;
  const std::array<int64_t, 8> st = broadcast_strides(*c.in[0].shape, big);
  size_t k = big.size();  // y's axes [k, rank) form one run of `run` elements
  int64_t run = 1;
  const bool fill = k > 0 && st[k - 1] == 0;
  while (k > 0 && st[k - 1] == (fill ? 0 : run)) run *= big[--k];
  const Shape rows(big.begin(), big.begin() + static_cast<std::ptrdiff_t>(k));
  dispatch_storage(c.in[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* x = c.in[0].as<T>();
    T* y = c.out[0].as<T>();
    for_each_broadcast(
        st, rows,
        [&](int64_t i, int64_t j) {
          if (fill)
            std::fill_n(y + i * run, run, x[j]);
          else
            std::copy_n(x + j, run, y + i * run);
        },
        std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(run, 1)));
  });
}

}  // namespace flowrun::cpu
