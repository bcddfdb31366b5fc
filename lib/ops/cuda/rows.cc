// KernelCtx adapters of the row-wise CUDA kernels (ops/cuda/rows.cu).
#include "ops/cpu/norm.h"  // norm_row_blocks: the blocks of rows the workspace is planned for
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"
#include "parallel/comm.h"

namespace flowrun::cuda {

namespace {

// Rows of the last axis.
int64_t cols_of(const TensorView& t) {
  return t.rank() == 0 ? 1 : t.dim(-1);
}
int64_t rows_of(const TensorView& t) {
  const int64_t c = cols_of(t);
  return c == 0 ? 0 : t.numel() / c;
}

// cross_entropy's optional denominator (input i), or null.
const void* denominator(const KernelCtx& c, int i) {
  return c.num_in > i ? c.in[i].data : nullptr;
}

// Logits split over the tensor axis by class (attrs offset: this rank's first class, classes: all of them;
// graph/sbp_parallel.cc), as the CPU kernel: the row maxima, then the sums of exponentials and the target
// logits are reduced over the axis's ranks (NCCL, on the kernel stream) in the workspace's three doubles a
// row, so that every rank ends with the whole rows' lse and the loss. One rank (no tensor axis) reduces
// nothing.
void cross_entropy_split(const KernelCtx& c) {
  const TensorView& x = c.in[0];
  const int64_t rows = rows_of(x);
  FR_CHECK(c.workspace_bytes >= static_cast<size_t>(3 * rows) * sizeof(double), c.node->name,
           ": the workspace holds no row statistics");
  double* stats = static_cast<double*>(c.workspace);
  const int64_t* labels = c.in[1].as<int64_t>();
  Communicator* tp = on_stream(c.tp, c);
  cross_entropy_split_max(storage_of(x.dtype), x.data, rows, cols_of(x), stats, stream_of(c));
  if (tp) tp->all_reduce(stats, rows, DType::f64, ReduceOp::max);
  cross_entropy_split_sums(storage_of(x.dtype), x.data, labels, rows, cols_of(x), c.attrs().i("offset"),
                           stats, stream_of(c));
  if (tp) tp->all_reduce(stats + rows, 2 * rows, DType::f64, ReduceOp::sum);
  cross_entropy_split_loss(storage_of(x.dtype), labels, denominator(c, 2), c.out[0].data, c.out[1].data, rows,
                           c.attrs().i("classes"), c.attrs().i("ignore_index", -100), stats, stream_of(c));
}

}  // namespace

void softmax(const KernelCtx& c) {
  softmax(storage_of(c.in[0].dtype), false, c.in[0].data, c.out[0].data, rows_of(c.in[0]), cols_of(c.in[0]),
          stream_of(c));
}
void log_softmax(const KernelCtx& c) {
  softmax(storage_of(c.in[0].dtype), true, c.in[0].data, c.out[0].data, rows_of(c.in[0]), cols_of(c.in[0]),
          stream_of(c));
}
void softmax_grad(const KernelCtx& c) {
  softmax_grad(storage_of(c.in[0].dtype), false, c.in[0].data, c.in[1].data, c.out[0].data, rows_of(c.in[0]),
               cols_of(c.in[0]), stream_of(c));
}
void log_softmax_grad(const KernelCtx& c) {
  softmax_grad(storage_of(c.in[0].dtype), true, c.in[0].data, c.in[1].data, c.out[0].data, rows_of(c.in[0]),
               cols_of(c.in[0]), stream_of(c));
}

void cross_entropy(const KernelCtx& c) {
  if (c.attrs().has("classes")) return cross_entropy_split(c);
  const TensorView& x = c.in[0];
  FR_CHECK(c.workspace_bytes >= static_cast<size_t>(rows_of(x)) * sizeof(double), c.node->name,
           ": the workspace holds no per-row losses");
  cross_entropy(storage_of(x.dtype), x.data, c.in[1].as<int64_t>(), denominator(c, 2), c.out[0].data,
                c.out[1].data, rows_of(x), cols_of(x), c.attrs().i("ignore_index", -100),
                static_cast<double*>(c.workspace), stream_of(c));
}

// Under a class split (attrs offset, classes) lse is the whole rows' already: nothing to reduce.
void cross_entropy_grad(const KernelCtx& c) {
  const TensorView& x = c.in[1];
  FR_CHECK(c.workspace_bytes >= sizeof(float), c.node->name, ": no workspace for the gradient's scale");
  cross_entropy_grad(storage_of(x.dtype), c.in[0].data, x.data, c.in[2].as<int64_t>(), c.in[3].data,
                     denominator(c, 4), c.out[0].data, rows_of(x), cols_of(x),
                     c.attrs().i("ignore_index", -100), c.attrs().i("offset", 0),
                     c.attrs().i("classes", cols_of(x)), static_cast<float*>(c.workspace), stream_of(c));
}

void layernorm(const KernelCtx& c) {
  const TensorView& x = c.in[0];
  check_same_dtype(c, x.dtype, 1);
  layernorm(storage_of(x.dtype), x.data, c.in[1].data, c.in[2].data, c.out[0].data, c.out[1].data,
            c.out[2].data, rows_of(x), cols_of(x), static_cast<float>(c.attrs().f("eps", 1e-5)),
            stream_of(c));
}

// The parameter gradients' f32 partial sums per block of rows live in the workspace the CPU kernel uses for
// the same (cpu::norm_row_blocks blocks, `parts` vectors each; sized in f32 for f16/bf16).
float* dparams_partials(const KernelCtx& c, const TensorView& x, int64_t parts) {
  const int64_t blocks = cpu::norm_row_blocks(rows_of(x));
  FR_CHECK(
      blocks == 1 || c.workspace_bytes >= static_cast<size_t>(parts * blocks * cols_of(x)) * sizeof(float),
      c.node->name, ": the workspace holds fewer partial sums than blocks of rows");
  return static_cast<float*>(c.workspace);
}

void layernorm_grad(const KernelCtx& c) {
  const TensorView& x = c.in[1];
  check_same_dtype(c, x.dtype, 2);
  layernorm_grad(storage_of(x.dtype), c.in[0].data, x.data, c.in[2].data, c.in[3].data, c.in[4].data,
                 c.out[0].data, c.out[1].data, c.out[2].data, rows_of(x), cols_of(x),
                 dparams_partials(c, x, 2), cpu::norm_row_blocks(rows_of(x)), stream_of(c));
}

void rmsnorm(const KernelCtx& c) {
  const TensorView& x = c.in[0];
  check_same_dtype(c, x.dtype, 1);
  rmsnorm(storage_of(x.dtype), x.data, c.in[1].data, c.out[0].data, c.out[1].data, rows_of(x), cols_of(x),
          static_cast<float>(c.attrs().f("eps", 1e-6)), stream_of(c));
}

void rmsnorm_grad(const KernelCtx& c) {
  const TensorView& x = c.in[1];
  check_same_dtype(c, x.dtype, 2);
  rmsnorm_grad(storage_of(x.dtype), c.in[0].data, x.data, c.in[2].data, c.in[3].data, c.out[0].data,
               c.out[1].data, rows_of(x), cols_of(x), dparams_partials(c, x, 1),
               cpu::norm_row_blocks(rows_of(x)), stream_of(c));
}

void nll_loss(const KernelCtx& c) {
  const TensorView& logp = c.in[0];
  nll_loss(storage_of(logp.dtype), logp.data, c.in[1].as<int64_t>(), c.out[0].data, rows_of(logp),
           cols_of(logp), c.attrs().i("ignore_index", -100), stream_of(c));
}

void nll_loss_grad(const KernelCtx& c) {
  const TensorView& logp = c.in[1];
  nll_loss_grad(storage_of(logp.dtype), c.in[0].data, c.in[2].as<int64_t>(), c.out[0].data, rows_of(logp),
                cols_of(logp), c.attrs().i("ignore_index", -100), stream_of(c));
}

}  // namespace flowrun::cuda
