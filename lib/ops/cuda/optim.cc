// KernelCtx adapters of the CUDA optimizer updates (ops/cuda/optim.cu).
#include "ops/cpu/optim.h"  // kNormBlock: the blocks of the gradient norm, on every device

#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"
#include "parallel/comm.h"

namespace flowrun::cuda {

namespace {

// The learning rate and the gradient coefficient are f32 device scalars.
const float* f32_scalar(const KernelCtx& c, int index) {
  if (c.num_in <= index) return nullptr;
  FR_CHECK(c.in[index].dtype == DType::f32, c.node->name, ": input ", index,
           " must be an f32 scalar on the GPU");
  return c.in[index].as<float>();
}

// The node's tensors (attr tensors of each of `lists` lists: params, grads, then state) in lists of at most
// kMultiTensors, each handed to `launch`; on the stack, as a kernel adapter must not allocate.
template <typename Launch>
void each_tensor_list(const KernelCtx& c, int lists, Launch launch) {
  const int n = static_cast<int>(c.attrs().i("tensors"));
  MultiTensorList t;
  for (int k = 0; k < n; ++k) {
    if (t.count == kMultiTensors) {
      launch(t);
      t.count = 0;
    }
    const int j = t.count++;
    t.p[j] = c.in[k].as<float>();
    t.g[j] = c.in[n + k].as<float>();
    t.s0[j] = c.in[2 * n + k].as<float>();
    t.s1[j] = lists > 3 ? c.in[3 * n + k].as<float>() : nullptr;
    t.n[j] = c.in[k].numel();
  }
  launch(t);
}

// 1 - dampening in double, rounded once (as the CPU kernel).
SgdParams sgd_params(const KernelCtx& c) {
  return {static_cast<float>(c.attrs().f("momentum", 0)),
          static_cast<float>(1.0 - c.attrs().f("dampening", 0)),
          static_cast<float>(c.attrs().f("weight_decay", 0)), c.attrs().b("nesterov")};
}

}  // namespace

// The squares of inputs [0, split_inputs) (pieces of gradients split over the tensor axis) are summed over
// its ranks, then the total over the data axis's when the gradients are sharded (ZeRO) and over the
// pipeline's stages, as the CPU kernel sums them: each total in a fixed order, so every rank ends with the
// same bits.
void global_norm(const KernelCtx& c) {
  double* partial = static_cast<double*>(c.workspace);
  const int64_t split_inputs = c.attrs().i("split_inputs", 0);
  int64_t blocks = 0, split_blocks = 0;
  for (int k = 0; k < c.num_in; ++k) {
    const TensorView& x = c.in[k];
    sum_squares(storage_of(x.dtype), x.data, x.numel(), cpu::kNormBlock, partial + blocks, stream_of(c));
    blocks += (x.numel() + cpu::kNormBlock - 1) / cpu::kNormBlock;
    if (k + 1 == split_inputs) split_blocks = blocks;
  }
  FR_CHECK(c.workspace_bytes >= static_cast<size_t>(blocks + 2) * sizeof(double), c.node->name,
           ": the workspace holds fewer partial sums than blocks");
  Communicator* tp = split_inputs > 0 ? on_stream(c.tp, c) : nullptr;
  Communicator* data = c.attrs().b("data_sharded") ? on_stream(c.comm, c) : nullptr;
  Communicator* pp = c.attrs().b("pipeline") ? on_stream(c.pp, c) : nullptr;
  if (!tp && !data && !pp) {
    norm_from_partials(partial, blocks, c.attrs().f("scale", 1.0), c.out[0].as<float>(), stream_of(c));
    return;
  }
  double* totals = partial + blocks;  // [split inputs', the others']
  sum_partials(partial, split_blocks, totals, stream_of(c));
  sum_partials(partial + split_blocks, blocks - split_blocks, totals + 1, stream_of(c));
  if (tp) tp->all_reduce(totals, 1, DType::f64, ReduceOp::sum);
  sum_partials(totals, 2, totals + 1, stream_of(c));
  if (data) data->all_reduce(totals + 1, 1, DType::f64, ReduceOp::sum);
  if (pp) pp->all_reduce(totals + 1, 1, DType::f64, ReduceOp::sum);
  norm_from_partials(totals + 1, 1, c.attrs().f("scale", 1.0), c.out[0].as<float>(), stream_of(c));
}

void clip_coef(const KernelCtx& c) {
  clip_coef(f32_scalar(c, 0), c.attrs().f("max_norm"), c.attrs().f("scale", 1.0), c.out[0].as<float>(),
            stream_of(c));
}

void unscale_coef(const KernelCtx& c) {
  const LossScaling a{c.attrs().f("scale", 1.0), c.attrs().f("max_norm", 0.0), 0, 0, 0, true};
  unscale_coef(a, f32_scalar(c, 0), f32_scalar(c, 1), c.out[0].as<float>(), c.out[1].as<float>(),
               stream_of(c));
}

void loss_scale_update(const KernelCtx& c) {
  const LossScaling a{0,
                      0,
                      c.attrs().f("backoff_factor", 0.5),
                      c.attrs().f("growth_factor", 2.0),
                      c.attrs().i("growth_interval", 2000),
                      c.attrs().b("dynamic", true)};
  loss_scale_update(a, f32_scalar(c, 0), c.in[1].as<float>(), c.in[2].as<int64_t>(), c.in[3].as<int64_t>(),
                    stream_of(c));
}

void grad_accumulate(const KernelCtx& c) {
  grad_accumulate(storage_of(c.in[0].dtype), c.in[0].data, c.in[1].data, c.in[2].as<int64_t>(),
                  c.in[0].numel(), stream_of(c));
}

void sgd_update(const KernelCtx& c) {
  sgd_update(sgd_params(c), c.in[0].as<float>(), c.in[1].as<float>(), c.in[2].as<float>(), f32_scalar(c, 3),
             c.in[4].as<int64_t>(), f32_scalar(c, 5), c.in[0].numel(), stream_of(c));
}

void adamw_update(const KernelCtx& c) {
  const AdamParams a{c.attrs().f("beta1"), c.attrs().f("beta2"), c.attrs().f("eps"),
                     c.attrs().f("weight_decay", 0), c.attrs().b("decoupled")};
  adamw_update(a, c.in[0].as<float>(), c.in[1].as<float>(), c.in[2].as<float>(), c.in[3].as<float>(),
               f32_scalar(c, 4), c.in[5].as<int64_t>(), f32_scalar(c, 6), c.in[0].numel(), stream_of(c));
}

void sgd_update_multi(const KernelCtx& c) {
  const SgdParams a = sgd_params(c);
  const int n = static_cast<int>(c.attrs().i("tensors"));
  each_tensor_list(c, 3, [&](const MultiTensorList& t) {
    sgd_update_multi(a, t, f32_scalar(c, 3 * n), c.in[3 * n + 1].as<int64_t>(), f32_scalar(c, 3 * n + 2),
                     stream_of(c));
  });
}

void adamw_update_multi(const KernelCtx& c) {
  const AdamParams a{c.attrs().f("beta1"), c.attrs().f("beta2"), c.attrs().f("eps"),
                     c.attrs().f("weight_decay", 0), c.attrs().b("decoupled")};
  const int n = static_cast<int>(c.attrs().i("tensors"));
  each_tensor_list(c, 4, [&](const MultiTensorList& t) {
    adamw_update_multi(a, t, f32_scalar(c, 4 * n), c.in[4 * n + 1].as<int64_t>(), f32_scalar(c, 4 * n + 2),
                       stream_of(c));
  });
}

}  // namespace flowrun::cuda
