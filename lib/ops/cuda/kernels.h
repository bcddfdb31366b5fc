// The CUDA kernels as the op registry calls them (KernelFn), registered by ops/cuda/register.cc. They launch
// on KernelCtx::stream and take device pointers; ops/cuda/launch.h holds the launchers they call.
#pragma once

#include <cuda_runtime_api.h>

#include "core/cuda/runtime.h"
#include "ops/registry.h"

namespace flowrun::cuda {

enum class Storage : int;
Storage storage_of(DType t);  // throws for dtypes the CUDA kernels do not store
cudaStream_t stream_of(const KernelCtx& c);
// The CUDA norms take gamma, beta and their statistics in x's storage type: the mixed-precision pass gives
// them f32 ones with a low-precision x only where a kernel lists KernelDef::f32_inputs, which these do not.
// Throws, naming the node, if an input from `first` on is of another dtype than x.
void check_same_dtype(const KernelCtx& c, DType x, int first);

// Elementwise (ops/cuda/elementwise.cc): the ops of ops/elementwise.cc, f32/f16/bf16.
void add(const KernelCtx& c);
void sub(const KernelCtx& c);
void mul(const KernelCtx& c);
void div(const KernelCtx& c);
void add_scalar(const KernelCtx& c);
void mul_scalar(const KernelCtx& c);
void pow_scalar(const KernelCtx& c);
void relu(const KernelCtx& c);
void gelu(const KernelCtx& c);
void silu(const KernelCtx& c);
void tanh(const KernelCtx& c);
void sigmoid(const KernelCtx& c);
void relu_grad(const KernelCtx& c);
void gelu_grad(const KernelCtx& c);
void silu_grad(const KernelCtx& c);
void tanh_grad(const KernelCtx& c);
void sigmoid_grad(const KernelCtx& c);
void fill_like(const KernelCtx& c);
void copy(const KernelCtx& c);  // stop_gradient, reshape (when not planned in place)
void cast(const KernelCtx& c);  // between f32, f16 and bf16

// Row-wise (ops/cuda/rows.cc): f32, f16, bf16. cross_entropy's workspace holds its per-row losses (with the
// classes split over the tensor axis, the row statistics reduced over its ranks), its gradient's the scale
// dloss / count; the norms' gradients' their f32 partial sums per block of rows.
void softmax(const KernelCtx& c);
void log_softmax(const KernelCtx& c);
void softmax_grad(const KernelCtx& c);
void log_softmax_grad(const KernelCtx& c);
void cross_entropy(const KernelCtx& c);
void cross_entropy_grad(const KernelCtx& c);
void layernorm(const KernelCtx& c);
void layernorm_grad(const KernelCtx& c);
void rmsnorm(const KernelCtx& c);
void rmsnorm_grad(const KernelCtx& c);
void nll_loss(const KernelCtx& c);
void nll_loss_grad(const KernelCtx& c);

// Index ops (ops/cuda/index.cc): any dtype for the gathers, f32/f16/bf16 for reductions, the squared error
// (its workspace: one double per chunk) and embeddings.
void transpose(const KernelCtx& c);
void permute(const KernelCtx& c);
void broadcast_to(const KernelCtx& c);
void reduce_sum(const KernelCtx& c);
void reduce_mean(const KernelCtx& c);
void reduce_max(const KernelCtx& c);
void reduce_max_grad(const KernelCtx& c);
void mse_loss(const KernelCtx& c);
void embedding(const KernelCtx& c);
void embedding_grad(const KernelCtx& c);

// Attention (ops/cuda/attention.cc): f32, f16, bf16 with an f32 lse; sdpa_grad's workspace holds the rows'
// dout . out.
void sdpa(const KernelCtx& c);
void sdpa_grad(const KernelCtx& c);
// The rotary position embedding (ops/cuda/attention.cc, kernel in rope.cu): f32, f16, bf16; in place or not.
void rope(const KernelCtx& c);
// Decoding with a key/value cache: sdpa_cache (f32; ops/cuda/attention.cc) and slice_at (any dtype;
// ops/cuda/shape.cc), kernels in decode.cu.
void sdpa_cache(const KernelCtx& c);
void slice_at(const KernelCtx& c);

// Dropout (ops/cuda/random.cc): the CPU kernel's mask, element for element.
void dropout(const KernelCtx& c);
void dropout_grad(const KernelCtx& c);
void mlm_mask(const KernelCtx& c);  // i64 ids

// Shape ops (ops/cuda/shape.cc): strided row copies, any dtype.
void slice(const KernelCtx& c);
void slice_grad(const KernelCtx& c);
void concat(const KernelCtx& c);
void split(const KernelCtx& c);

// Optimizer updates (ops/cuda/optim.cc): f32 parameters (the master weights) in place.
void sgd_update(const KernelCtx& c);
void global_norm(const KernelCtx& c);  // summed over the mesh axes that split or shard the gradients
void clip_coef(const KernelCtx& c);
void grad_accumulate(const KernelCtx& c);
void unscale_coef(const KernelCtx& c);  // fp16 loss scaling
void loss_scale_update(const KernelCtx& c);
void adamw_update(const KernelCtx& c);
void sgd_update_multi(const KernelCtx& c);
void adamw_update_multi(const KernelCtx& c);

// cuBLASLt (ops/cuda/blas.cc): f32, f16, bf16, accumulating in f32.
void matmul(const KernelCtx& c);
void linear(const KernelCtx& c);  // the bias in the GEMM's epilogue

// Collectives (ops/cuda/comm.cc) through NCCL communicators (parallel/cuda/nccl.h) on the kernel stream.
// on_stream: a group's NCCL communicator, set to launch on c's stream; null for a one-rank group (whose
// collectives are the identity), and an error for a host communicator.
Communicator* on_stream(Communicator* g, const KernelCtx& c);
void all_reduce(const KernelCtx& c);
void local_shard(const KernelCtx& c);
void all_gather_into(const KernelCtx& c);
void gather_shards(const KernelCtx& c);
void reduce_scatter_shard(const KernelCtx& c);
void all_reduce_start(const KernelCtx& c);
void all_reduce_wait(const KernelCtx& c);
void sbp_all_reduce(const KernelCtx& c);
void sbp_copy(const KernelCtx& c);  // sbp_enter
void sbp_all_gather(const KernelCtx& c);
void sbp_slice(const KernelCtx& c);
void sbp_reduce_scatter(const KernelCtx& c);

// Convolution through cuDNN (ops/cuda/conv.cc): f32 (no TF32), f16, bf16, accumulating in f32, deterministic
// algorithms; conv_workspace is the cuDNN workspace every conv node plans (KernelDef::workspace).
void conv2d(const KernelCtx& c);  // the bias added after, by a kernel
void conv2d_grad_input(const KernelCtx& c);
void conv2d_grad_weight(const KernelCtx& c);
size_t conv_workspace(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& a);
// Pooling (ops/cuda/conv.cc and conv.cu): f32, f16, bf16; the gradients are gathers (no atomics).
void maxpool2d(const KernelCtx& c);
void maxpool2d_grad(const KernelCtx& c);
void avgpool2d(const KernelCtx& c);
void avgpool2d_grad(const KernelCtx& c);
void global_avgpool(const KernelCtx& c);

// Batch normalisation (ops/cuda/batchnorm.cc): f32, f16, bf16, the running statistics updated in place; their
// workspaces hold f32 channel statistics and per-part sums.
void batchnorm(const KernelCtx& c);
void batchnorm_grad(const KernelCtx& c);
size_t batchnorm_workspace(const std::vector<TensorType>& in, const std::vector<TensorType>& out,
                           const Attrs& a);
size_t batchnorm_grad_workspace(const std::vector<TensorType>& in, const std::vector<TensorType>& out,
                                const Attrs& a);

}  // namespace flowrun::cuda
