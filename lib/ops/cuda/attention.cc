// KernelCtx adapters of the CUDA attention (ops/cuda/attention.cu) and rotary embedding (ops/cuda/rope.cu).
#include <cmath>

#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace flowrun::cuda {

namespace {

// key_ids: input `ids_at` when the node has it.
Attention geometry(const KernelCtx& c, const TensorView& q, const TensorView& k, const TensorView& v,
                   int ids_at) {
  const int64_t d = q.dim(3);
  Attention a{};
  if (c.num_in > ids_at) {
    a.key_ids = c.in[ids_at].as<int64_t>();
    a.heads = q.dim(1);
    a.pad_id = c.attrs().i("pad_id");
  }
  a.bh = q.dim(0) * q.dim(1);
  a.t = q.dim(2);
  a.s = k.dim(2);
  a.d = d;
  a.dv = v.dim(3);
  a.causal = c.attrs().b("causal", true);
  a.scale = static_cast<float>(c.attrs().f("scale", 1.0 / std::sqrt(static_cast<double>(d))));
  if (a.d > kAttentionMaxHeadDim || a.dv > kAttentionMaxHeadDim)
    throw runtime_error(cat(c.node->name, ": the CUDA attention takes head dims up to ", kAttentionMaxHeadDim,
                            " (its tiles in shared memory), not ", a.d, " and ", a.dv));
  return a;
}

}  // namespace

void sdpa(const KernelCtx& c) {
  const TensorView &q = c.in[0], &k = c.in[1], &v = c.in[2];
  sdpa(storage_of(q.dtype), geometry(c, q, k, v, 3), q.data, k.data, v.data, c.out[0].data,
       c.out[1].as<float>(), stream_of(c));
}

void sdpa_grad(const KernelCtx& c) {
  const TensorView &q = c.in[1], &k = c.in[2], &v = c.in[3];
  const Attention a = geometry(c, q, k, v, 6);
  FR_CHECK(c.workspace_bytes >= static_cast<size_t>(a.bh * a.t) * sizeof(float), c.node->name,
           ": the workspace holds no row sums");
  sdpa_grad(storage_of(q.dtype), a, c.in[0].data, q.data, k.data, v.data, c.in[4].data, c.in[5].as<float>(),
            c.out[0].data, c.out[1].data, c.out[2].data, static_cast<float*>(c.workspace), stream_of(c));
}

void rope(const KernelCtx& c) {
  const TensorView& x = c.in[0];
  const Rope r{x.dim(0) * x.dim(1) * x.dim(2),
               x.dim(2),
               x.dim(3),
               c.attrs().i("offset", 0),
               c.attrs().f("theta", 10000.0),
               c.attrs().b("inverse", false),
               c.num_in == 2 ? c.in[1].as<int64_t>() : nullptr};
  rope(storage_of(x.dtype), r, x.data, c.out[0].data, stream_of(c));
}

void sdpa_cache(const KernelCtx& c) {
  const TensorView &q = c.in[0], &kc = c.in[3];
  FR_CHECK(kc.dim(2) <= kCacheMaxLength, c.node->name, ": a cache of ", kc.dim(2), " positions, above the ",
           kCacheMaxLength, " the kernel's shared memory holds");
  const CacheAttention a{
      q.dim(0) * q.dim(1),
      q.dim(2),
      kc.dim(2),
      q.dim(3),
      c.in[2].dim(3),
      static_cast<float>(c.attrs().f("scale", 1.0 / std::sqrt(static_cast<double>(q.dim(3))))),
      c.in[5].as<int64_t>(),
      q.dim(1),
      c.in[1].dim(1)};
  sdpa_cache(a, q.as<float>(), c.in[1].as<float>(), c.in[2].as<float>(), kc.as<float>(), c.in[4].as<float>(),
             c.out[0].as<float>(), stream_of(c));
}

}  // namespace flowrun::cuda
