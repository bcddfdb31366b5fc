// KernelCtx adapters of the CUDA optimizer updates (ops/cuda/optim.cu).
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace flowrun::cuda {

namespace {

// The learning rate and the gradient coefficient are f32 device scalars.
const float* f32_scalar(const KernelCtx& c, int index) {
  if (c.num_in <= index) return nullptr;
  FR_CHECK(c.in[index].dtype == DType::f32, c.node->name, ": input ", index,
           " must be an f32 scalar on the GPU");
  return c.in[index].as<float>();
}

}  // namespace

void sgd_update(const KernelCtx& c) {
  const SgdParams a{static_cast<float>(c.attrs().f("momentum", 0)),
                    static_cast<float>(c.attrs().f("dampening", 0)),
                    static_cast<float>(c.attrs().f("weight_decay", 0)), c.attrs().b("nesterov")};
  sgd_update(a, c.in[0].as<float>(), c.in[1].as<float>(), c.in[2].as<float>(), f32_scalar(c, 3),
             f32_scalar(c, 4), c.in[0].numel(), stream_of(c));
}

void adamw_update(const KernelCtx& c) {
  const AdamParams a{c.attrs().f("beta1"), c.attrs().f("beta2"), c.attrs().f("eps"),
                     c.attrs().f("weight_decay", 0), c.attrs().b("decoupled")};
  adamw_update(a, c.in[0].as<float>(), c.in[1].as<float>(), c.in[2].as<float>(), c.in[3].as<float>(),
               f32_scalar(c, 4), c.in[5].as<int64_t>(), f32_scalar(c, 6), c.in[0].numel(), stream_of(c));
}

}  // namespace flowrun::cuda
