// KernelCtx adapters of the CUDA batchnorm kernels (ops/cuda/batchnorm.cu), and their workspace: f32
// channel statistics and per-part sums (cuda::batchnorm_workspace_floats), not the CPU kernels' T-typed
// per-plane sums.
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace flowrun::cuda {

namespace {

// x (N, C, spatial...) as (n, c, s).
BatchNorm batch_of(const Shape& x, const Attrs& a) {
  BatchNorm b{};
  b.n = x[0];
  b.c = x[1];
  b.s = b.n * b.c == 0 ? 0 : numel(x) / (b.n * b.c);
  b.eps = static_cast<float>(a.f("eps", 1e-5));
  b.momentum = static_cast<float>(a.f("momentum", 0.1));
  b.training = a.b("training", true);
  return b;
}

float* workspace_for(const KernelCtx& c, const BatchNorm& b, int64_t sums) {
  FR_CHECK(c.workspace_bytes >=
               static_cast<size_t>(batchnorm_workspace_floats(b.c, b.n * b.s, sums)) * sizeof(float),
           c.node->name, ": the workspace holds fewer channel sums than the CUDA batchnorm needs");
  return static_cast<float*>(c.workspace);
}

size_t workspace_bytes(const Shape& x, int64_t sums) {
  const int64_t c = x[1], m = c == 0 ? 0 : numel(x) / c;
  return static_cast<size_t>(batchnorm_workspace_floats(c, m, sums)) * sizeof(float);
}

}  // namespace

void batchnorm(const KernelCtx& c) {
  const TensorView& x = c.in[0];
  check_same_dtype(c, x.dtype, 1);
  FR_CHECK(!c.attrs().b("relu"), c.node->name, ": the CUDA batchnorm has no fused relu (a CPU fusion)");
  const BatchNorm b = batch_of(*x.shape, c.attrs());
  batchnorm(storage_of(x.dtype), b, x.data, c.in[1].data, c.in[2].data, c.in[3].data, c.in[4].data,
            c.out[0].data, c.out[1].data, c.out[2].data, workspace_for(c, b, b.training ? 1 : 0),
            stream_of(c));
}

void batchnorm_grad(const KernelCtx& c) {
  const TensorView& x = c.in[1];
  check_same_dtype(c, x.dtype, 2);
  FR_CHECK(c.num_in == 5, c.node->name, ": the CUDA batchnorm_grad takes no relu mask (a CPU fusion)");
  const BatchNorm b = batch_of(*x.shape, c.attrs());
  batchnorm_grad(storage_of(x.dtype), b, c.in[0].data, x.data, c.in[2].data, c.in[3].data, c.in[4].data,
                 c.out[0].data, c.out[1].data, c.out[2].data, workspace_for(c, b, 2), stream_of(c));
}

size_t batchnorm_workspace(const std::vector<TensorType>& in, const std::vector<TensorType>&,
                           const Attrs& a) {
  return workspace_bytes(in[0].shape, a.b("training", true) ? 1 : 0);
}

size_t batchnorm_grad_workspace(const std::vector<TensorType>& in, const std::vector<TensorType>&,
                                const Attrs&) {
  return workspace_bytes(in[1].shape, 2);
}

}  // namespace flowrun::cuda
