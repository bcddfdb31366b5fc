// CPU kernels of the attention ops (ops/attention.cc): flash-attention forward and backward, rotary
// position embedding.
#pragma once

#include <cmath>

#include "ops/registry.h"

namespace flowrun::cpu {

// (q, k, v) -> (out, lse): online-softmax attention over key blocks, never materialising the T x S scores.
void sdpa(const KernelCtx& c);
// (dout, q, k, v, out, lse) -> (dq, dk, dv): FlashAttention-2 backward, probabilities recomputed from lse.
void sdpa_grad(const KernelCtx& c);

// sdpa over packed projections, the graph's split -> heads -> sdpa -> merge in one op (CPU fusion):
// qkv (B, T, 3 H D) -> (out (B, T, H D), lse (B, H, T)); attr heads. And its gradient: (dout, qkv, out, lse)
// -> dqkv. Both read and write the rows in place; the gradient's transposed k and v take
// kSdpaQkvGradBuffers (T x D) buffers of the thread's scratch (thread_scratch).
void sdpa_qkv(const KernelCtx& c);
void sdpa_qkv_grad(const KernelCtx& c);
constexpr int64_t kSdpaQkvGradBuffers = 2;
// sdpa on the projections' rows, the graph's reshape -> transpose -> sdpa -> transpose -> reshape of separate
// q, k and v in one op (CPU fusion): q (B, T, H D), k (B, S, H D), v (B, S, H Dv) [, key_ids (B, S)] ->
// (out (B, T, H Dv), lse (B, H, T)); attr heads. And its gradient: (dout, q, k, v, out, lse [, key_ids]) ->
// (dq, dk, dv). The workspaces are sdpa's and sdpa_grad's.
void sdpa_rows(const KernelCtx& c);
void sdpa_rows_grad(const KernelCtx& c);
// The pool of the attention kernels' per-thread scratch (thread_scratch: one buffer per thread, which the
// forward and backward kernels use in turn).
inline constexpr const char* kSdpaThreadBuffers = "sdpa per-thread head buffers";

#if defined(__AVX512BF16__)
// Native bf16 sdpa and sdpa_grad (attention_bf16.cc): compiled where the compiler targets avx512_bf16
// (FLOWRUN_NATIVE on such a CPU) and registered as available where the running CPU has it; elsewhere bf16
// attention runs widened through the f32 kernels. sdpa_grad's workspace holds every head's repacked operands
// and f32 accumulators. The forwards take no workspace (sdpa_bf16_forward_workspace): a thread packs one head
// at a time into its thread_scratch, as the packed gradient does, reported as host buffers.
bool has_avx512_bf16();
// Whether programs run these kernels (KernelDef::available): where the CPU has avx512_bf16 but not AMX. On a
// Sapphire Rapids-class host (AMX) the f32 kernels run bf16 attention faster, widened: its vdpbf16ps pair
// products reach no more than its two f32 FMA ports, and the repacking and rounding come on top.
bool bf16_attention_native();
void sdpa_bf16(const KernelCtx& c);
void sdpa_grad_bf16(const KernelCtx& c);
size_t sdpa_bf16_forward_workspace(const std::vector<TensorType>& in, const std::vector<TensorType>& out,
                                   const Attrs& a);
std::vector<std::pair<std::string, size_t>> sdpa_bf16_buffers(const std::vector<TensorType>& in,
                                                              const std::vector<TensorType>& out,
                                                              const Attrs& a);
size_t sdpa_grad_bf16_workspace(const std::vector<TensorType>& in, const std::vector<TensorType>& out,
                                const Attrs& a);
// sdpa_qkv and its gradient in bf16: the kernels above on the packed rows (A operands copied contiguous);
// their per-thread head scratch (the forward's or the gradient's, by the inputs) as host buffers.
void sdpa_qkv_bf16(const KernelCtx& c);
void sdpa_qkv_grad_bf16(const KernelCtx& c);
std::vector<std::pair<std::string, size_t>> sdpa_qkv_bf16_buffers(const std::vector<TensorType>& in,
                                                                  const std::vector<TensorType>& out,
                                                                  const Attrs& a);
// sdpa_rows and its gradient in bf16, on the rows in place; their per-thread head scratch as host buffers.
void sdpa_rows_bf16(const KernelCtx& c);
void sdpa_rows_grad_bf16(const KernelCtx& c);
std::vector<std::pair<std::string, size_t>> sdpa_rows_bf16_buffers(const std::vector<TensorType>& in,
                                                                   const std::vector<TensorType>& out,
                                                                   const Attrs& a);
#endif

// (q, k, v, k_cache, v_cache, position) -> out: k and v written into the caches at the position, then each
// query attends over the cached keys up to its own position (a KV-cache decode or prefill step).
void sdpa_cache(const KernelCtx& c);

// Rotary position embedding (ops/cpu/rope.cc): x (B, H, T, D) -> y, pairs (i, i + D/2) rotated by the angle
// of (position, i); may run in place.
void rope(const KernelCtx& c);

// The rotation angle of pair i of a row at `position` with head dim d, as Hugging Face computes it in float32
// (transformers' default RoPE): inv_freq = 1 / theta^(fl(2i) / d) in f32, angle = fl32(position * inv_freq).
// The power is taken in double and rounded once (glibc's powf is correctly rounded, so this is its value
// but for double-rounding ties), so that the CUDA kernel (ops/cuda/rope.cu) computes the same bits. The
// kernels then take cos and sin of this f32 angle in double and round them once to the kernel's type: within
// an ulp of PyTorch's float32 cos/sin at every position, where an angle formed in double would drift from
// HF's by up to |angle| * 2^-24 (6e-5 at position 1000).
inline float rope_angle(int64_t position, int64_t i, int64_t d, double theta) {
  const float e = static_cast<float>(2 * i) / static_cast<float>(d);
  const float p =
      static_cast<float>(std::pow(static_cast<double>(static_cast<float>(theta)), static_cast<double>(e)));
  const float inv_freq = 1.0f / p;
  return static_cast<float>(position) * inv_freq;
}

}  // namespace flowrun::cpu
