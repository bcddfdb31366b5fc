// CPU layout kernels: byte copies over (outer, axis, inner) views as contiguous memcpy runs, and a tiled
// transpose for permutations that move the innermost axis. Pure copies, so every thread count gives the same
// bits.
#include "ops/cpu/shape.h"

#include <cstring>
#include <tuple>

#include "ops/cpu/parallel.h"

namespace flowrun::cpu {

namespace {

// Below this many bytes a copy runs on one thread: an OpenMP fork costs about as much as copying it.
constexpr int64_t kGrainBytes = 1 << 18;
// Tile edge of the transpose. 16 rather than 32: with power-of-two row strides (4096 columns) the rows of a
// 32-row tile fall into the same L1 sets and evict each other, which made 32 about 1.8x slower there.
constexpr int64_t kTile = 16;

// Element-sized integers that may alias any dtype's storage (f16/bf16 structs, floats), so the tile loops can
// move elements as plain loads and stores without breaking strict aliasing.
typedef uint8_t u8a;
typedef uint16_t __attribute__((may_alias)) u16a;
typedef uint32_t __attribute__((may_alias)) u32a;
typedef uint64_t __attribute__((may_alias)) u64a;

struct AxisView {
  int64_t outer = 1, len = 1, inner = 1;
};

AxisView axis_view(const Shape& s, int axis) {
  AxisView v;
  for (int i = 0; i < axis; ++i) v.outer *= s[static_cast<size_t>(i)];
  v.len = s[static_cast<size_t>(axis)];
  for (size_t i = static_cast<size_t>(axis) + 1; i < s.size(); ++i) v.inner *= s[i];
  return v;
}

int norm_axis(int64_t axis, size_t rank) {
  const auto r = static_cast<int64_t>(rank);
  FR_CHECK(axis >= -r && axis < r, "axis ", axis, " out of range for rank ", rank);
  return static_cast<int>(axis < 0 ? axis + r : axis);
}

// Copies `rows` rows of `row_bytes` between strided buffers. Work is split by bytes, not rows, so a single
// large row (a slice near the front of the shape) still spreads over the threads.
void copy_rows(char* dst, int64_t dst_stride, const char* src, int64_t src_stride, int64_t rows,
               int64_t row_bytes) {
  const int64_t total = rows * row_bytes;
  if (total == 0) return;
  if (dst_stride == row_bytes && src_stride == row_bytes) {
    dst_stride = src_stride = row_bytes = total;  // fully contiguous: one run
  }
  parallel_for(total, kGrainBytes, [&](int64_t b, int64_t e) {
    int64_t r = b / row_bytes, off = b % row_bytes;
    for (int64_t pos = b; pos < e; off = 0, ++r) {
      const int64_t n = std::min(row_bytes - off, e - pos);
      std::memcpy(dst + r * dst_stride + off, src + r * src_stride + off, static_cast<size_t>(n));
      pos += n;
    }
  });
}

// A row of the big tensor is the concatenation of one row of each segment (concat's inputs, split's outputs,
// slice_grad's zeros|dy|zeros). seg(k) returns {segment k's contiguous buffer, its row width in bytes}; a
// null buffer is a gap filled with zeros (all-zero bytes are 0 in every dtype). Gather fills `big` from the
// segments, scatter the reverse. Split by the big tensor's bytes, so every thread streams one contiguous
// range.
template <bool kGather, typename Seg>
void segmented_rows(char* big, int64_t rows, int64_t row_bytes, int nseg, Seg seg) {
  const int64_t total = rows * row_bytes;
  if (total == 0) return;
  parallel_for(total, kGrainBytes, [&](int64_t b, int64_t e) {
    int64_t r = b / row_bytes, off = b % row_bytes;
    int k = 0;
    int64_t seg_start = 0;
    auto [p, w] = seg(0);
    while (off >= seg_start + w) {
      seg_start += w;
      std::tie(p, w) = seg(++k);
    }
    for (int64_t pos = b;;) {
      const int64_t n = std::min(seg_start + w - off, e - pos);
      char* bp = big + r * row_bytes + off;
      if (p == nullptr) {
        if constexpr (kGather) std::memset(bp, 0, static_cast<size_t>(n));
      } else if (n > 0) {
        char* sp = p + r * w + (off - seg_start);
        if constexpr (kGather)
          std::memcpy(bp, sp, static_cast<size_t>(n));
        else
          std::memcpy(sp, bp, static_cast<size_t>(n));
      }
      pos += n;
      off += n;
      if (pos >= e) break;
      seg_start += w;
      if (++k == nseg) {
        k = 0;
        seg_start = off = 0;
        ++r;
      }
      std::tie(p, w) = seg(k);
    }
  });
}

// A permutation after dropping size-1 axes and merging input axes that stay adjacent and in order in the
// output: [B,H,T,D]->[B,T,H,D] becomes a 4-D one, but [N,C,H,W]->[N,H,W,C] becomes [N,C,HW]->[N,HW,C].
struct Layout {
  int rank = 0;
  int64_t dim[kMaxLayoutRank] = {};  // input dims
  int perm[kMaxLayoutRank] = {};     // output axis j reads input axis perm[j]
};

Layout simplify(const Shape& in, const int* perm) {
  const int rank = static_cast<int>(in.size());
  int map[kMaxLayoutRank];
  int64_t d1[kMaxLayoutRank];
  int r1 = 0;
  for (int i = 0; i < rank; ++i) {
    map[i] = in[static_cast<size_t>(i)] == 1 ? -1 : r1;
    if (map[i] >= 0) d1[r1++] = in[static_cast<size_t>(i)];
  }
  int p1[kMaxLayoutRank];
  int n1 = 0;
  for (int j = 0; j < rank; ++j)
    if (map[perm[j]] >= 0) p1[n1++] = map[perm[j]];
  // Groups of output axes that read consecutive input axes, in output order.
  int gstart[kMaxLayoutRank];
  int64_t gsize[kMaxLayoutRank];
  int ng = 0;
  for (int j = 0; j < n1; ++j) {
    if (j > 0 && p1[j] == p1[j - 1] + 1) {
      gsize[ng - 1] *= d1[p1[j]];
    } else {
      gstart[ng] = p1[j];
      gsize[ng++] = d1[p1[j]];
    }
  }
  Layout l;
  l.rank = ng;
  for (int g = 0; g < ng; ++g) {
    int pos = 0;  // the group's place among the merged input axes
    for (int h = 0; h < ng; ++h) pos += gstart[h] < gstart[g];
    l.perm[g] = pos;
    l.dim[pos] = gsize[g];
  }
  return l;
}

// A mixed-radix counter over some output axes, tracking byte offsets into the source and destination.
struct Odometer {
  int m = 0;
  int64_t dim[kMaxLayoutRank] = {}, src[kMaxLayoutRank] = {}, dst[kMaxLayoutRank] = {};
  void offsets(int64_t k, int64_t& so, int64_t& dso) const {
    so = dso = 0;
    for (int j = m - 1; j >= 0; --j) {
      const int64_t x = k % dim[j];
      k /= dim[j];
      so += x * src[j];
      dso += x * dst[j];
    }
  }
};

// Transposes rows [i0, i1) x columns [j0, j1) of a 2-D block: src(i, j) at i*sa + j, dst(i, j) at j*dq + i
// (in elements). Writes are contiguous, reads strided within a tile that stays in cache.
template <typename E>
void transpose_tile(const char* src, char* dst, int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t sa,
                    int64_t dq) {
  const E* s = reinterpret_cast<const E*>(src);
  E* d = reinterpret_cast<E*>(dst);
  if (i1 - i0 == kTile && j1 - j0 == kTile) {
    // Full tile: fixed trip counts let the compiler unroll the strided reads.
    const E* st = s + i0 * sa + j0;
    E* dt = d + j0 * dq + i0;
    for (int64_t j = 0; j < kTile; ++j)
      for (int64_t i = 0; i < kTile; ++i) dt[j * dq + i] = st[i * sa + j];
    return;
  }
  for (int64_t j = j0; j < j1; ++j) {
    E* dj = d + j * dq;
    const E* sj = s + j;
    for (int64_t i = i0; i < i1; ++i) dj[i] = sj[i * sa];
  }
}

template <typename E>
void tiled_permute(const char* src, char* dst, const Layout& l, const int64_t* in_stride,
                   const int64_t* out_stride) {
  const int r = l.rank;
  const int a = l.perm[r - 1];  // input axis that becomes the output's innermost
  int q = 0;                    // output position of the input's innermost axis
  while (l.perm[q] != r - 1) ++q;
  const int64_t rows = l.dim[a], cols = l.dim[r - 1], sa = in_stride[a], dq = out_stride[q];
  Odometer o;
  int64_t outer = 1;
  for (int j = 0; j < r - 1; ++j) {
    if (j == q) continue;
    o.dim[o.m] = l.dim[l.perm[j]];
    o.src[o.m] = in_stride[l.perm[j]] * static_cast<int64_t>(sizeof(E));
    o.dst[o.m++] = out_stride[j] * static_cast<int64_t>(sizeof(E));
    outer *= l.dim[l.perm[j]];
  }
  const int64_t nti = (rows + kTile - 1) / kTile, ntj = (cols + kTile - 1) / kTile;
  const int64_t items = outer * nti * ntj;
  const int64_t grain = std::max<int64_t>(1, kGrainBytes / (kTile * kTile * static_cast<int64_t>(sizeof(E))));
  parallel_for(items, grain, [&](int64_t b, int64_t e) {
    for (int64_t it = b; it < e; ++it) {
      const int64_t tj = it % ntj, ti = (it / ntj) % nti;
      int64_t so, dso;
      o.offsets(it / (ntj * nti), so, dso);
      transpose_tile<E>(src + so, dst + dso, ti * kTile, std::min(rows, (ti + 1) * kTile), tj * kTile,
                        std::min(cols, (tj + 1) * kTile), sa, dq);
    }
  });
}

// Permutes a contiguous tensor of `es`-byte elements (rank <= kMaxLayoutRank).
void permute_bytes(const char* src, char* dst, const Shape& in, const int* perm, int64_t es) {
  FR_CHECK(in.size() <= static_cast<size_t>(kMaxLayoutRank), "permute of rank ", in.size(),
           " is not supported");
  const int64_t total = numel(in);
  if (total == 0) return;
  const Layout l = simplify(in, perm);
  const int r = l.rank;
  if (r <= 1) return copy_rows(dst, 0, src, 0, 1, total * es);  // only size-1 axes moved: a plain copy
  int64_t in_stride[kMaxLayoutRank], out_stride[kMaxLayoutRank];
  in_stride[r - 1] = out_stride[r - 1] = 1;
  for (int i = r - 2; i >= 0; --i) {
    in_stride[i] = in_stride[i + 1] * l.dim[i + 1];
    out_stride[i] = out_stride[i + 1] * l.dim[l.perm[i + 1]];
  }
  if (l.perm[r - 1] == r - 1) {
    // The innermost axis stays innermost: copy contiguous runs of it, walking the other axes in output order.
    const int64_t run = l.dim[r - 1] * es, nruns = total / l.dim[r - 1];
    Odometer o;
    o.m = r - 1;
    for (int j = 0; j < r - 1; ++j) {
      o.dim[j] = l.dim[l.perm[j]];
      o.src[j] = in_stride[l.perm[j]] * es;
    }
    parallel_for(nruns, std::max<int64_t>(1, kGrainBytes / run), [&](int64_t b, int64_t e) {
      int64_t idx[kMaxLayoutRank];
      int64_t rem = b, so = 0;
      for (int j = o.m - 1; j >= 0; --j) {
        idx[j] = rem % o.dim[j];
        rem /= o.dim[j];
        so += idx[j] * o.src[j];
      }
      for (int64_t k = b; k < e; ++k) {
        std::memcpy(dst + k * run, src + so, static_cast<size_t>(run));
        for (int j = o.m - 1; j >= 0; --j) {
          so += o.src[j];
          if (++idx[j] < o.dim[j]) break;
          so -= o.src[j] * o.dim[j];
          idx[j] = 0;
        }
      }
    });
    return;
  }
  switch (es) {
    case 1:
      return tiled_permute<u8a>(src, dst, l, in_stride, out_stride);
    case 2:
      return tiled_permute<u16a>(src, dst, l, in_stride, out_stride);
    case 4:
      return tiled_permute<u32a>(src, dst, l, in_stride, out_stride);
    case 8:
      return tiled_permute<u64a>(src, dst, l, in_stride, out_stride);
    default:
      FR_CHECK(false, "no permute for ", es, "-byte elements");
  }
}

int64_t esize(const TensorView& t) {
  return static_cast<int64_t>(dtype_size(t.dtype));
}
char* bytes(const TensorView& t) {
  return static_cast<char*>(t.data);
}

}  // namespace

void transpose(const KernelCtx& c) {
  const TensorView& x = c.in[0];
  const size_t rank = x.rank();
  FR_CHECK(rank <= static_cast<size_t>(kMaxLayoutRank), "transpose of rank ", rank, " is not supported");
  int perm[kMaxLayoutRank];
  for (int i = 0; i < static_cast<int>(rank); ++i) perm[i] = i;
  std::swap(perm[norm_axis(c.attrs().i("dim0"), rank)], perm[norm_axis(c.attrs().i("dim1"), rank)]);
  permute_bytes(bytes(x), bytes(c.out[0]), *x.shape, perm, esize(x));
}

void permute(const KernelCtx& c) {
  const TensorView& x = c.in[0];
  const std::vector<int64_t>& p = c.attrs().ints("perm");
  FR_CHECK(p.size() == x.rank() && p.size() <= static_cast<size_t>(kMaxLayoutRank), "bad permutation");
  int perm[kMaxLayoutRank];
  for (size_t j = 0; j < p.size(); ++j) perm[j] = norm_axis(p[j], p.size());
  permute_bytes(bytes(x), bytes(c.out[0]), *x.shape, perm, esize(x));
}

void slice(const KernelCtx& c) {
  const TensorView &x = c.in[0], &y = c.out[0];
  const int axis = norm_axis(c.attrs().i("axis"), x.rank());
  const AxisView v = axis_view(*x.shape, axis);
  const auto [start, end] = resolve_slice(c.attrs().i("start", 0), c.attrs().i("end", INT64_MAX), v.len);
  const int64_t ib = v.inner * esize(x);
  copy_rows(bytes(y), (end - start) * ib, bytes(x) + start * ib, v.len * ib, v.outer, (end - start) * ib);
}

void slice_at(const KernelCtx& c) {
  const TensorView &x = c.in[0], &y = c.out[0];
  const int axis = norm_axis(c.attrs().i("axis"), x.rank());
  const AxisView v = axis_view(*x.shape, axis);
  const int64_t start = c.in[1].as<int64_t>()[0], len = y.dim(axis);
  // The caller (the generator) keeps the window inside the axis; a start outside it is a bug, not input.
  FR_CHECK(start >= 0 && start <= v.len - len, c.node->name, ": window [", start, ", ", start + len,
           ") outside an axis of ", v.len);
  const int64_t ib = v.inner * esize(x);
  copy_rows(bytes(y), len * ib, bytes(x) + start * ib, v.len * ib, v.outer, len * ib);
}

void slice_grad(const KernelCtx& c) {
  const TensorView &dy = c.in[0], &dx = c.out[0];
  const int axis = norm_axis(c.attrs().i("axis"), dx.rank());
  const AxisView v = axis_view(*dx.shape, axis);
  const auto [start, end] = resolve_slice(c.attrs().i("start"), c.attrs().i("end"), v.len);
  const int64_t ib = v.inner * esize(dx);
  char* const src = bytes(dy);
  const int64_t widths[3] = {start * ib, (end - start) * ib, (v.len - end) * ib};
  segmented_rows<true>(bytes(dx), v.outer, v.len * ib, 3, [&](int k) {
    return std::pair<char*, int64_t>{k == 1 ? src : nullptr, widths[k]};
  });
}

void concat(const KernelCtx& c) {
  const TensorView& y = c.out[0];
  const int axis = norm_axis(c.attrs().i("axis"), y.rank());
  const AxisView v = axis_view(*y.shape, axis);
  const int64_t ib = v.inner * esize(y);
  segmented_rows<true>(bytes(y), v.outer, v.len * ib, c.num_in, [&](int k) {
    return std::pair<char*, int64_t>{bytes(c.in[k]), c.in[k].dim(axis) * ib};
  });
}

void split(const KernelCtx& c) {
  const TensorView& x = c.in[0];
  const int axis = norm_axis(c.attrs().i("axis"), x.rank());
  const AxisView v = axis_view(*x.shape, axis);
  const int64_t ib = v.inner * esize(x);
  segmented_rows<false>(bytes(x), v.outer, v.len * ib, c.num_out, [&](int k) {
    return std::pair<char*, int64_t>{bytes(c.out[k]), c.out[k].dim(axis) * ib};
  });
}

}  // namespace flowrun::cpu
