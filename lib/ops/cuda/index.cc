// KernelCtx adapters of the index CUDA kernels (ops/cuda/index.cu): the strides are worked out here.
#include <algorithm>
#include <numeric>

#include "ops/cpu/nn.h"  // kMseChunk: the chunks the workspace is planned for
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace flowrun::cuda {

namespace {

// Row-major element strides of a shape.
std::vector<int64_t> strides_of(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (size_t k = s.size(); k-- > 1;) st[k - 1] = st[k] * s[k];
  return st;
}

Strided strided(const Shape& dims, const std::vector<int64_t>& stride) {
  FR_CHECK(dims.size() <= 8, "the CUDA index kernels take at most 8 axes, not ", dims.size());
  Strided s;
  s.rank = static_cast<int>(dims.size());
  std::copy(dims.begin(), dims.end(), s.dims);
  std::copy(stride.begin(), stride.end(), s.stride);
  return s;
}

// Output axis j reads input axis perm[j].
void permute_by(const KernelCtx& c, const std::vector<int>& perm) {
  const std::vector<int64_t> in = strides_of(*c.in[0].shape);
  std::vector<int64_t> st;
  for (int p : perm) st.push_back(in[static_cast<size_t>(p)]);
  gather_strided(dtype_size(c.in[0].dtype), c.in[0].data, c.out[0].data, c.out[0].numel(),
                 strided(*c.out[0].shape, st), stream_of(c));
}

int axis_of(int64_t a, size_t rank) {
  return static_cast<int>(a < 0 ? a + static_cast<int64_t>(rank) : a);
}

// Which of `rank` axes a reduction's attribute `axes` names (empty: all).
std::vector<bool> reduced_axes(const KernelCtx& c, size_t rank) {
  const std::vector<int64_t> axes = c.attrs().ints("axes", {});
  std::vector<bool> reduced(rank, axes.empty());
  for (int64_t a : axes) reduced[static_cast<size_t>(axis_of(a, rank))] = true;
  return reduced;
}

}  // namespace

void transpose(const KernelCtx& c) {
  const size_t r = c.in[0].rank();
  std::vector<int> perm(r);
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[static_cast<size_t>(axis_of(c.attrs().i("dim0"), r))],
            perm[static_cast<size_t>(axis_of(c.attrs().i("dim1"), r))]);
  permute_by(c, perm);
}

void permute(const KernelCtx& c) {
  std::vector<int> perm;
  for (int64_t p : c.attrs().ints("perm")) perm.push_back(axis_of(p, c.in[0].rank()));
  permute_by(c, perm);
}

// The input aligned to the output's last axes; stride 0 where it has extent 1 (or no axis).
void broadcast_to(const KernelCtx& c) {
  const Shape &in = *c.in[0].shape, &out = *c.out[0].shape;
  const std::vector<int64_t> ist = strides_of(in);
  std::vector<int64_t> st(out.size(), 0);
  for (size_t k = 0; k < in.size(); ++k) {
    const size_t j = out.size() - in.size() + k;
    st[j] = in[k] == 1 ? 0 : ist[k];
  }
  gather_strided(dtype_size(c.in[0].dtype), c.in[0].data, c.out[0].data, c.out[0].numel(), strided(out, st),
                 stream_of(c));
}

namespace {

// Output (the kept axes) and reduced axes, each with the input's strides.
void reduce_over_axes(const KernelCtx& c, Reduction op) {
  const Shape& in = *c.in[0].shape;
  const std::vector<int64_t> st = strides_of(in);
  const std::vector<bool> reduced = reduced_axes(c, in.size());
  Shape kept_dims, red_dims;
  std::vector<int64_t> kept_st, red_st;
  for (size_t k = 0; k < in.size(); ++k) {
    (reduced[k] ? red_dims : kept_dims).push_back(in[k]);
    (reduced[k] ? red_st : kept_st).push_back(st[k]);
  }
  // The CPU's mean: the sum times 1 / count, in f32.
  const float scale = 1.0f / static_cast<float>(numel(red_dims));
  reduce(op, storage_of(c.in[0].dtype), c.in[0].data, c.out[0].data, c.out[0].numel(),
         strided(kept_dims, kept_st), strided(red_dims, red_st), scale, stream_of(c));
}

}  // namespace

void reduce_sum(const KernelCtx& c) {
  reduce_over_axes(c, Reduction::sum);
}
void reduce_mean(const KernelCtx& c) {
  reduce_over_axes(c, Reduction::mean);
}
void reduce_max(const KernelCtx& c) {
  reduce_over_axes(c, Reduction::max);
}

// Inputs (dy, x, y), dy and y of the reduced shape: x's axes index them with the reduced tensor's row-major
// strides (keepdims), 0 along the reduced axes.
void reduce_max_grad(const KernelCtx& c) {
  const TensorView& x = c.in[1];
  const Shape& xs = *x.shape;
  const std::vector<bool> reduced = reduced_axes(c, xs.size());
  std::vector<int64_t> st(xs.size(), 0);
  int64_t s = 1;
  for (size_t k = xs.size(); k-- > 0;) {
    if (reduced[k]) continue;
    st[k] = s;
    s *= xs[k];
  }
  reduce_max_grad(storage_of(x.dtype), c.in[0].data, x.data, c.in[2].data, c.out[0].data, x.numel(),
                  strided(xs, st), stream_of(c));
}

void mse_loss(const KernelCtx& c) {
  const TensorView& pred = c.in[0];
  const int64_t n = pred.numel();
  FR_CHECK(
      c.workspace_bytes >= static_cast<size_t>((n + cpu::kMseChunk - 1) / cpu::kMseChunk) * sizeof(double),
      c.node->name, ": the workspace holds fewer partial sums than chunks");
  mse_loss(storage_of(pred.dtype), pred.data, c.in[1].data, c.out[0].data, n, cpu::kMseChunk,
           static_cast<double*>(c.workspace), stream_of(c));
}

void embedding(const KernelCtx& c) {
  const TensorView& table = c.in[1];
  embedding(storage_of(table.dtype), c.in[0].as<int64_t>(), table.data, c.out[0].data, c.in[0].numel(),
            table.dim(0), table.dim(1), c.attrs().i("offset", 0), stream_of(c));
}

void embedding_grad(const KernelCtx& c) {
  const TensorView& dt = c.out[0];
  embedding_grad(storage_of(dt.dtype), c.in[0].data, c.in[1].as<int64_t>(), dt.data, c.in[1].numel(),
                 dt.dim(0), dt.dim(1), c.attrs().i("offset", 0), stream_of(c));
}

}  // namespace flowrun::cuda
