// KernelCtx adapters of the CUDA dropout and mlm_mask (ops/cuda/random.cu).
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace flowrun::cuda {

namespace {

// Random ops number a piece of a split tensor by its index in the whole one (attrs rng_whole, rng_start),
// after the step's earlier micro-batches (see the CPU kernel): the piece's dims and whole-tensor strides,
// its first element's number (*base) and the whole tensor's size (*whole).
Strided whole_numbering(const KernelCtx& c, const char* op, int64_t* base, int64_t* whole) {
  const Shape& local = *c.in[0].shape;
  FR_CHECK(local.size() <= 8, "the CUDA ", op, " takes at most 8 axes");
  const Attrs& a = c.attrs();
  const Shape w = a.has("rng_whole") ? Shape(a.ints("rng_whole")) : local;
  const std::vector<int64_t> start =
      a.has("rng_start") ? a.ints("rng_start") : std::vector<int64_t>(local.size(), 0);
  FR_CHECK(c.device_step != nullptr, c.node->name, ": the CUDA ", op, " needs the step in device memory");
  Strided s;
  s.rank = static_cast<int>(local.size());
  int64_t stride = 1;
  *base = 0;
  for (size_t ax = local.size(); ax-- > 0;) {
    s.dims[ax] = local[ax];
    s.stride[ax] = stride;
    *base += start[ax] * stride;
    stride *= w[ax];
  }
  *whole = stride;
  return s;
}

}  // namespace

void dropout(const KernelCtx& c) {
  const TensorView& x = c.in[0];
  DropoutDraw d{c.attrs().f("p", 0.5), c.rng.seed, c.node_stream, c.device_step, 0, 0};
  const Strided s = whole_numbering(c, "dropout", &d.base, &d.whole);
  dropout(storage_of(x.dtype), d, s, x.data, c.out[0].data, c.out[1].as<uint8_t>(), x.numel(), stream_of(c));
}

void dropout_grad(const KernelCtx& c) {
  dropout_grad(storage_of(c.in[0].dtype), c.attrs().f("p", 0.5), c.in[0].data, c.in[1].as<uint8_t>(),
               c.out[0].data, c.in[0].numel(), stream_of(c));
}

// Numbered as dropout (above); the masking's attributes as the CPU kernel reads them.
void mlm_mask(const KernelCtx& c) {
  const TensorView& ids = c.in[0];
  const Attrs& a = c.attrs();
  const double mask_p = a.f("mask_p", 0.8);
  MlmDraw d{a.f("p", 0.15),
            mask_p,
            mask_p + a.f("random_p", 0.1),
            a.i("vocab"),
            a.i("mask_id"),
            a.b("fixed", false),
            c.rng.seed,
            c.node_stream,
            c.device_step,
            0,
            0};
  const Strided s = whole_numbering(c, "mlm_mask", &d.base, &d.whole);
  mlm_mask(d, s, ids.as<int64_t>(), c.out[0].as<int64_t>(), c.out[1].as<int64_t>(), ids.numel(),
           stream_of(c));
  FR_CHECK(c.workspace_bytes >= sizeof(unsigned long long), c.node->name, ": no workspace for the count");
  mlm_count(d, d.whole * a.i("micro_batches", 1), ids.numel(), static_cast<unsigned long long*>(c.workspace),
            c.out[2].as<float>(), stream_of(c));
}

}  // namespace flowrun::cuda
