// The CUDA kernels' launchers: plain functions over device pointers, so that the .cu files nvcc compiles see
// no project header but this one, and the adapters (ops/cuda/*.cc) turn KernelCtx into these calls.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace flowrun::cuda {

// Element storage of a floating tensor; arithmetic is f32 inside the kernels (f16/bf16 round to nearest-even
// on store, as the CPU kernels do).
enum class Storage : int { f32, f16, bf16 };

// numpy broadcasting over at most 8 axes: the output's dims and each input's element strides (0 where that
// input is stretched).
struct Broadcast {
  int rank = 0;
  int64_t dims[8] = {};
  int64_t stride_a[8] = {};
  int64_t stride_b[8] = {};
};

enum class BinaryOp : int { add, sub, mul, div };
// y = a op b; `bc` null when a, b and y have n elements each.
void binary(BinaryOp op, Storage t, const void* a, const void* b, void* y, int64_t n, const Broadcast* bc,
            cudaStream_t s);

enum class UnaryOp : int {
  add_scalar,
  mul_scalar,
  pow_scalar,
  relu,
  gelu,
  gelu_tanh,
  silu,
  tanh,
  sigmoid,
  fill
};
// y = f(x) (fill: y = value; x unread).
void unary(UnaryOp op, Storage t, const void* x, void* y, int64_t n, float value, cudaStream_t s);

// dx = f(dy, z) where z is the forward input (gelu, silu) or output (relu, tanh, sigmoid).
enum class GradOp : int { relu, gelu, gelu_tanh, silu, tanh, sigmoid };
void unary_grad(GradOp op, Storage t, const void* dy, const void* z, void* dx, int64_t n, cudaStream_t s);

// y = x converted between storages.
void convert(Storage from, const void* x, Storage to, void* y, int64_t n, cudaStream_t s);

// Row-wise ops (ops/cuda/rows.cu) over `rows` contiguous rows of `cols` elements, one thread block a row.
// softmax or log_softmax (log) along the rows, and their gradients from (dy, y).
void softmax(Storage t, bool log, const void* x, void* y, int64_t rows, int64_t cols, cudaStream_t s);
void softmax_grad(Storage t, bool log, const void* dy, const void* y, void* dx, int64_t rows, int64_t cols,
                  cudaStream_t s);
// Cross-entropy of logits x with integer labels: lse per row, and loss = the mean of lse - x[label] over the
// rows whose label is not `ignore` (labels outside [0, cols) count and add 0). `partial`: rows doubles.
// `den` (null: none): a scalar of x's type that replaces the count (the sum over it; 0 where it is 0), here
// and in the split loss and the gradient below.
void cross_entropy(Storage t, const void* x, const int64_t* labels, const void* den, void* loss, void* lse,
                   int64_t rows, int64_t cols, int64_t ignore, double* partial, cudaStream_t s);
// Vocabulary-parallel cross-entropy: x holds columns [offset, offset + cols) of rows of `classes` logits (the
// classes split over the tensor axis), and the caller reduces the row statistics over the axis's ranks
// between the steps. `stats`: 3 x rows doubles, [row maxima | sums of exponentials | target logits].
// Step 1: stats[r] = this rank's row maximum (reduce: max).
void cross_entropy_split_max(Storage t, const void* x, int64_t rows, int64_t cols, double* stats,
                             cudaStream_t s);
// Step 2: this rank's f32 sum of exp(x - max) and its target logit (0 unless it holds the label's column)
// per row (reduce the 2 x rows doubles from stats + rows: sum).
void cross_entropy_split_sums(Storage t, const void* x, const int64_t* labels, int64_t rows, int64_t cols,
                              int64_t offset, double* stats, cudaStream_t s);
// Step 3: lse = max + log(sum) per row, and the loss: the mean of lse - target over the rows whose label is
// not `ignore` (labels outside [0, classes) count and add 0), summed in row order in double.
void cross_entropy_split_loss(Storage t, const int64_t* labels, const void* den, void* loss, void* lse,
                              int64_t rows, int64_t classes, int64_t ignore, double* stats, cudaStream_t s);
// dx = dloss / count * (softmax(x) - onehot(label)), zero rows for ignored labels and labels outside [0,
// classes); x holds columns [offset, offset + cols) of the rows (offset 0 and classes = cols unless the
// classes are split), lse the whole rows'. `scale`: one float of scratch.
void cross_entropy_grad(Storage t, const void* dloss, const void* x, const int64_t* labels, const void* lse,
                        const void* den, void* dx, int64_t rows, int64_t cols, int64_t ignore, int64_t offset,
                        int64_t classes, float* scale, cudaStream_t s);
// The mean of -logp[label] over the rows whose label is not `ignore` (labels outside [0, cols) count and add
// 0), summed in row order in double; its gradient -dloss / count at each counted label, 0 elsewhere.
void nll_loss(Storage t, const void* logp, const int64_t* labels, void* loss, int64_t rows, int64_t cols,
              int64_t ignore, cudaStream_t s);
void nll_loss_grad(Storage t, const void* dloss, const int64_t* labels, void* dx, int64_t rows, int64_t cols,
                   int64_t ignore, cudaStream_t s);
// y = (x - mean) * rstd * gamma + beta per row of d, with the row statistics; and its gradient, dgamma and
// dbeta summed over `blocks` blocks of rows (the CPU's: rows [k * rows / blocks, (k + 1) * rows / blocks))
// into the f32 `partial` (blocks x 2 x d; unused when blocks is 1), then over the blocks in order.
void layernorm(Storage t, const void* x, const void* gamma, const void* beta, void* y, void* mean, void* rstd,
               int64_t rows, int64_t d, float eps, cudaStream_t s);
void layernorm_grad(Storage t, const void* dy, const void* x, const void* gamma, const void* mean,
                    const void* rstd, void* dx, void* dgamma, void* dbeta, int64_t rows, int64_t d,
                    float* partial, int64_t blocks, cudaStream_t s);
// y = x * rstd * gamma per row of d, rstd = 1 / sqrt(mean(x^2) + eps); and its gradient, dgamma summed as
// layernorm's (partial: blocks x d floats).
void rmsnorm(Storage t, const void* x, const void* gamma, void* y, void* rstd, int64_t rows, int64_t d,
             float eps, cudaStream_t s);
void rmsnorm_grad(Storage t, const void* dy, const void* x, const void* gamma, const void* rstd, void* dx,
                  void* dgamma, int64_t rows, int64_t d, float* partial, int64_t blocks, cudaStream_t s);

// Optimizer updates of f32 parameters in place (ops/cuda/optim.cu), as ops/cpu/optim.cc: the learning rate,
// step and gradient coefficient are device scalars (coef null: 1; a non-finite coef skips the update, as the
// loss scaler asks).
// SGD: undamped = 1 - dampening, formed in double and rounded once; at step 1 (read from the device when
// undamped != 1) the momentum buffer becomes the gradient, as PyTorch's.
struct SgdParams {
  float momentum, undamped, weight_decay;
  bool nesterov;
};
void sgd_update(const SgdParams& a, float* p, const float* g, float* buf, const float* lr,
                const int64_t* step, const float* coef, int64_t n, cudaStream_t s);
struct AdamParams {
  double beta1, beta2, eps, weight_decay;
  bool decoupled;
};
void adamw_update(const AdamParams& a, float* p, const float* g, float* m, float* v, const float* lr,
                  const int64_t* step, const float* coef, int64_t n, cudaStream_t s);
// The same updates of several tensors (the multi-tensor ops) in one launch per list: tensor k has n[k]
// elements at p[k], g[k] and its state s0[k] (SGD's momentum buffer, Adam's m) and s1[k] (Adam's v). Each
// element is computed by the formula of the single update's kernel. The list travels to the kernel by value,
// as a parameter: kMultiTensors tensors keep it under 4 KiB, the portable limit of a launch's parameters.
constexpr int kMultiTensors = 64;
struct MultiTensorList {
  int count = 0;
  float* p[kMultiTensors];
  const float* g[kMultiTensors];
  float* s0[kMultiTensors];
  float* s1[kMultiTensors];
  int64_t n[kMultiTensors];
};
void sgd_update_multi(const SgdParams& a, const MultiTensorList& t, const float* lr, const int64_t* step,
                      const float* coef, cudaStream_t s);
void adamw_update_multi(const AdamParams& a, const MultiTensorList& t, const float* lr, const int64_t* step,
                        const float* coef, cudaStream_t s);

// Index kernels (ops/cuda/index.cu). An output of `rank` <= 8 axes `dims`, whose element at multi-index i
// reads the input at sum(i[k] * stride[k]) (a permutation of the input's strides, or 0 along broadcast axes).
struct Strided {
  int rank = 0;
  int64_t dims[8] = {};
  int64_t stride[8] = {};
};
// y[i] = x[offset(i)] for the n elements of y, whose elements are elem_bytes (1, 2, 4 or 8) wide.
void gather_strided(size_t elem_bytes, const void* x, void* y, int64_t n, const Strided& out, cudaStream_t s);
// y[i] = the sum (mean: times `scale`, or maximum) over the reduced index r of x[offset(i) + offset_r(r)], n
// outputs, r in order.
enum class Reduction : int { sum, mean, max };
void reduce(Reduction op, Storage t, const void* x, void* y, int64_t n, const Strided& out,
            const Strided& reduced, float scale, cudaStream_t s);
// dx[i] = dy[offset(i)] where x[i] equals the maximum y[offset(i)], else 0; `in`: x's dims with the strides
// of the reduced tensor (0 along reduced axes).
void reduce_max_grad(Storage t, const void* dy, const void* x, const void* y, void* dx, int64_t n,
                     const Strided& in, cudaStream_t s);
// mean((pred - target)^2) as the CPU sums it: per chunk of `chunk` elements 16 interleaved double sums added
// pairwise into partial[chunk index], then the chunks in order.
void mse_loss(Storage t, const void* pred, const void* target, void* loss, int64_t n, int64_t chunk,
              double* partial, cudaStream_t s);
// Table rows by id (ids - offset outside [0, V) give zero rows), and the gradient summed per row in id order.
void embedding(Storage t, const int64_t* ids, const void* table, void* y, int64_t n, int64_t V, int64_t D,
               int64_t offset, cudaStream_t s);
void embedding_grad(Storage t, const void* dy, const int64_t* ids, void* dtable, int64_t n, int64_t V,
                    int64_t D, int64_t offset, cudaStream_t s);

// Scaled-dot-product attention (ops/cuda/attention.cu) over bh = batch x heads: q (t x d), k (s x d), v (s x
// dv) each, out (t x dv) and an f32 lse per query; under `causal` query i sees keys j <= i + s - t. Tiled as
// FlashAttention-2 (a block per tile of queries walking the key tiles with the online softmax; tensor cores
// for f16/bf16), so any length fits; the backward recomputes the probabilities from lse, `rowsum`: bh x t
// floats of scratch. A block per key tile (dk, dv) and per query tile (dq): no atomics, fixed summation
// orders. Head dims d and dv up to kAttentionMaxHeadDim: tiles of 16 rows of them fit in shared memory.
constexpr int64_t kAttentionMaxHeadDim = 256;
// Key padding (sdpa's optional key_ids, batch x s i64 on the device; null: none): key j of head h is hidden
// from every query where key_ids[(h / heads) * s + j] == pad_id. A query that sees no key gets out 0 and lse
// 0, and adds nothing to any gradient.
struct Attention {
  int64_t bh, t, s, d, dv;
  bool causal;
  float scale;
  const int64_t* key_ids = nullptr;
  int64_t heads = 1, pad_id = 0;
};
void sdpa(Storage st, const Attention& a, const void* q, const void* k, const void* v, void* out, float* lse,
          cudaStream_t s);
void sdpa_grad(Storage st, const Attention& a, const void* dout, const void* q, const void* k, const void* v,
               const void* out, const float* lse, void* dq, void* dk, void* dv, float* rowsum,
               cudaStream_t s);

// Rotary position embedding (ops/cuda/rope.cu), as the CPU kernel (ops/cpu/rope.cc): `rows` rows of d
// (batch x heads x t, position offset + row % t), pair (i, i + d/2) rotated by the angle HF forms in float32
// (ops/cpu/attention.h's rope_angle), cos and sin taken in double and rounded to f32; -angle if `inverse`.
// A thread per pair, so y may be x. `position` (device memory, may be null): added to offset, read by the
// kernel, so that a captured CUDA graph of a decode step follows the position the host writes each step.
struct Rope {
  int64_t rows, t, d, offset;
  double theta;
  bool inverse;
  const int64_t* position = nullptr;
};
void rope(Storage st, const Rope& r, const void* x, void* y, cudaStream_t s);

// Decoding with a key/value cache (ops/cuda/decode.cu), the position read from device memory. slice_at:
// rows start.. start + len of an axis of axis_len (the tensor as [outer, axis, row bytes]). sdpa_cache (f32):
// q of t new positions per (batch, head) (bh of them), k and v per (batch, key/value head) (bh / heads *
// kv_heads of them), written into the caches (l positions) at the position, then query i of head h attends
// over the cached keys 0..position + i of key/value head h / (heads / kv_heads); the scores of one query in
// shared memory (l + kWarps floats: l up to kCacheMaxLength).
void slice_at(const void* x, void* y, const int64_t* start, int64_t outer, int64_t len, int64_t axis_len,
              int64_t row, cudaStream_t s);
constexpr int64_t kCacheMaxLength = 12000;
struct CacheAttention {
  int64_t bh, t, l, d, dv;
  float scale;
  const int64_t* position;
  int64_t heads = 1, kv_heads = 1;
};
void sdpa_cache(const CacheAttention& a, const float* q, const float* k, const float* v, float* kc, float* vc,
                float* out, cudaStream_t s);

// Inverted dropout (ops/cuda/random.cu) drawing what the CPU kernel draws: element i of the step's batch is
// kept when 24 bits of word i % 4 of Philox4x32-10 block i / 4 of (seed, stream) give a uniform >= p, where
// stream = mix_stream(step[0], node_stream) (core/rng.cc) with the step and micro-batch read on the device
// (see KernelCtx::device_step). This rank's piece has the local dims of `local` (its strides: the whole
// tensor's) and starts at whole index `base`; micro-batch step[1] starts step[1] * `whole` (the whole
// tensor's elements) further.
struct DropoutDraw {
  double p;
  uint64_t seed, node_stream;
  const int64_t* step;
  int64_t base, whole;
};
void dropout(Storage t, const DropoutDraw& d, const Strided& local, const void* x, void* y, uint8_t* mask,
             int64_t n, cudaStream_t s);
void dropout_grad(Storage t, double p, const void* dy, const uint8_t* mask, void* dx, int64_t n,
                  cudaStream_t s);
// BERT's masking of i64 ids (ops/cuda/random.cu), drawing what the CPU kernel (ops/cpu/nn.cc) draws: element
// e of the step's batch (numbered as dropout's: `local`, `base`, `whole`, step[1]) reads Philox block e of
// (seed, mix_stream(fixed ? 0 : step[0], node_stream)).
struct MlmDraw {
  double p, mask_p, keep_above;  // keep_above = mask_p + random_p
  int64_t vocab, mask_id;
  bool fixed;
  uint64_t seed, node_stream;
  const int64_t* step;
  int64_t base, whole;
};
void mlm_mask(const MlmDraw& d, const Strided& local, const int64_t* ids, int64_t* out, int64_t* labels,
              int64_t n, cudaStream_t s);
// mlm_mask's count: the elements g of [0, total) (the step's whole batch, every micro-batch) whose word 0 of
// Philox block g selects them (the draw of mlm_mask above; d.base and d.whole unused), summed as an integer
// in `counter` (device scratch), then *count = selected * local / total as an f32.
void mlm_count(const MlmDraw& d, int64_t total, int64_t local, unsigned long long* counter, float* count,
               cudaStream_t s);

// The gradient norm's pieces (ops/cuda/optim.cu): the sum of squares of x[b * block, (b + 1) * block) in
// double into partial[b] for each block b of x; then out = scale * sqrt(sum of partial[0, n)) as an f32, the
// partials added in order.
void sum_squares(Storage t, const void* x, int64_t n, int64_t block, double* partial, cudaStream_t s);
void norm_from_partials(const double* partial, int64_t n, double scale, float* out, cudaStream_t s);
// *out = the sum of partial[0, n) in order (out may be one of them).
void sum_partials(const double* partial, int64_t n, double* out, cudaStream_t s);
// out = scale * min(1, max_norm / (norm + 1e-6)), every value a device f32 scalar.
void clip_coef(const float* norm, double max_norm, double scale, float* out, cudaStream_t s);
// fp16 loss scaling, as ops/cpu/optim.cc: coef = (scale attr) / loss_scale, clipped by max_norm (> 0) on the
// unscaled norm, NaN when the norm is not finite; and the scaler's update (state in device memory).
struct LossScaling {
  double scale, max_norm;  // unscale_coef's attributes
  double backoff, growth;  // loss_scale_update's factors
  int64_t growth_interval;
  bool dynamic;
};
void unscale_coef(const LossScaling& a, const float* norm, const float* loss_scale, float* coef,
                  float* true_norm, cudaStream_t s);
void loss_scale_update(const LossScaling& a, const float* norm, float* loss_scale, int64_t* good,
                       int64_t* skipped, cudaStream_t s);
// acc = g on the first micro-batch (*micro == 0), acc + g after.
void grad_accumulate(Storage t, void* acc, const void* g, const int64_t* micro, int64_t n, cudaStream_t s);

// The convolution's bias and pooling (ops/cuda/conv.cu) over NCHW planes, a thread per output element.
// y[(i * c + k) * plane + p] += bias[k] for the n images i of c channels.
void channel_bias(Storage t, void* y, const void* bias, int64_t n, int64_t c, int64_t plane, cudaStream_t s);
// A pooling window geometry over `planes` planes (n * c) of h x w, output oh x ow.
struct Pool {
  int64_t planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw;
};
// As the CPU kernel: the first maximum of each window wins (NaN propagates: the last NaN), the padding is
// never chosen; idx = ih * w + iw within the plane.
void maxpool2d(Storage t, const Pool& p, const void* x, void* y, int64_t* idx, cudaStream_t s);
// dx[e] = the sum, in output order, of dy over the windows holding e whose argmax is e: a gather per input
// element (no atomics). The indices must be maxpool2d's, each inside its own window.
void maxpool2d_grad(Storage t, const Pool& p, const void* dy, const int64_t* idx, void* dx, cudaStream_t s);
// Window sums in row-major order divided by kh * kw (include_pad) or the window's in-image count; the
// gradient gathers dy / divisor over the windows holding each input element, in output order.
void avgpool2d(Storage t, const Pool& p, bool include_pad, const void* x, void* y, cudaStream_t s);
void avgpool2d_grad(Storage t, const Pool& p, bool include_pad, const void* dy, void* dx, cudaStream_t s);
// y[p] = (sum of plane p's hw elements) * (1 / hw), a warp per plane.
void global_avgpool(Storage t, const void* x, void* y, int64_t planes, int64_t hw, cudaStream_t s);

// Batch normalisation (ops/cuda/batchnorm.cu) of x viewed as (n, c, s): per channel, m = n * s values. The
// channel sums are two-stage and fixed: block (channel, part) sums values [part * per, (part + 1) * per) of
// its channel in f32 (thread strides, then block_reduce), then a thread per channel adds the parts in order
// in double. The workspace (f32): the channel statistics the element passes read (2 x c), then the parts.
inline int64_t batchnorm_parts(int64_t m) {
  const int64_t p = (m + 4095) / 4096;  // about 16 values per thread of a block
  return p < 1 ? 1 : (p > 1024 ? 1024 : p);
}
// Floats of workspace for `sums` sums per channel at once (0: inference's forward, which sums nothing).
inline int64_t batchnorm_workspace_floats(int64_t c, int64_t m, int64_t sums) {
  return 2 * c + sums * c * batchnorm_parts(m);
}
struct BatchNorm {
  int64_t n, c, s;
  float eps, momentum;
  bool training;
};
// Training: batch mean and biased variance (the centred squares summed in a second pass), the running
// statistics updated in place (the unbiased variance); inference: the running statistics. Writes y and the
// saved mean and rstd.
void batchnorm(Storage t, const BatchNorm& b, const void* x, const void* gamma, const void* beta,
               void* running_mean, void* running_var, void* y, void* mean, void* rstd, float* ws,
               cudaStream_t s);
// dbeta = sum dy, dgamma = rstd sum dy (x - mean) per channel; dx = gamma rstd (dy - t dbeta - t (x - mean)
// rstd dgamma) with t = 1 / m in training, 0 in inference.
void batchnorm_grad(Storage t, const BatchNorm& b, const void* dy, const void* x, const void* gamma,
                    const void* mean, const void* rstd, void* dx, void* dgamma, void* dbeta, float* ws,
                    cudaStream_t s);

}  // namespace flowrun::cuda
