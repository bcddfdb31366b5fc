// KernelCtx adapters of the index CUDA kernels (ops/cuda/index.cu): the strides are worked out here.
#include <algorithm>
#include <numeric>

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

// Output (the kept axes) and reduced axes, each with the input's strides.
void reduce_sum(const KernelCtx& c) {
  const Shape& in = *c.in[0].shape;
  const std::vector<int64_t> st = strides_of(in);
  std::vector<int> axes;
  for (int64_t a : c.attrs().ints("axes", {})) axes.push_back(axis_of(a, in.size()));
  if (axes.empty())
    for (size_t k = 0; k < in.size(); ++k) axes.push_back(static_cast<int>(k));
  Shape kept_dims, red_dims;
  std::vector<int64_t> kept_st, red_st;
  for (size_t k = 0; k < in.size(); ++k) {
    const bool reduced = std::find(axes.begin(), axes.end(), static_cast<int>(k)) != axes.end();
    (reduced ? red_dims : kept_dims).push_back(in[k]);
    (reduced ? red_st : kept_st).push_back(st[k]);
  }
  reduce_sum(storage_of(c.in[0].dtype), c.in[0].data, c.out[0].data, c.out[0].numel(),
             strided(kept_dims, kept_st), strided(red_dims, red_st), stream_of(c));
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
