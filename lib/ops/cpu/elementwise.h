// CPU kernels of the elementwise ops (ops/elementwise.cc).
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

#include "ops/cpu/parallel.h"
#include "ops/registry.h"

namespace flowrun::cpu {

// Branch-free f32 <-> bf16/f16 conversions on raw bits, bit-identical to core/dtype.h's float_to_bf16,
// bf16_to_float, float_to_f16 and f16_to_float (nearest-even, quiet NaNs, exact subnormals): written as
// selects so that loops over them vectorise, which the branchy reference functions do not.
inline uint16_t bf16_bits_of(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}
inline float float_of_bf16_bits(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

inline uint16_t f16_bits_of(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u, abs = u & 0x7fffffffu;
  // Subnormal results: adding 0.5f aligns the f16 subnormal ulp (2^-24) with the last mantissa bit of the
  // sum, so the FPU's own nearest-even rounding does the work; the low bits of the sum are the f16 bits.
  const uint32_t sub = std::bit_cast<uint32_t>(std::bit_cast<float>(abs) + 0.5f) - 0x3f000000u;
  uint32_t normal = abs - 0x38000000u;
  normal = (normal + 0xfffu + ((normal >> 13) & 1u)) >> 13;
  uint32_t r = abs < 0x38800000u ? sub : normal;
  r = abs >= 0x477ff000u ? 0x7c00u : r;
  r = abs > 0x7f800000u ? 0x7e00u : r;
  return static_cast<uint16_t>(sign | r);
}
inline float float_of_f16_bits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  const float sub = static_cast<float>(man) * 5.9604644775390625e-8f;  // man * 2^-24, exact
  const uint32_t normal = ((exp + 112u) << 23) | (man << 13);
  const uint32_t special = 0x7f800000u | (man << 13);
  const uint32_t mag = exp == 0 ? std::bit_cast<uint32_t>(sub) : exp == 31 ? special : normal;
  return std::bit_cast<float>(sign | mag);
}

// Storage type S of a kernel and the type it computes in: native bf16 kernels load to f32, compute exactly as
// the f32 kernel does and round each output once, so they match a widened f32 kernel without its conversion
// passes through the workspace.
template <typename S>
using Compute = std::conditional_t<std::is_same_v<S, bf16>, float, S>;

template <typename S>
inline Compute<S> ld(S v) {
  if constexpr (std::is_same_v<S, bf16>)
    return float_of_bf16_bits(v.bits);
  else
    return v;
}
template <typename S>
inline S st(Compute<S> v) {
  if constexpr (std::is_same_v<S, bf16>)
    return bf16{bf16_bits_of(v)};
  else
    return v;
}

// Calls f with a typed null pointer (float*, double* or bf16*) for a storage dtype with a native kernel.
template <typename F>
void dispatch_storage(DType t, F&& f) {
  if (t == DType::bf16)
    f(static_cast<bf16*>(nullptr));
  else
    dispatch_float(t, f);
}

void add(const KernelCtx& c);
void sub(const KernelCtx& c);
void mul(const KernelCtx& c);
void div(const KernelCtx& c);
void add_scalar(const KernelCtx& c);
void mul_scalar(const KernelCtx& c);
void pow_scalar(const KernelCtx& c);
void relu(const KernelCtx& c);
void relu_grad(const KernelCtx& c);
void gelu(const KernelCtx& c);
// y = gelu(x) as the gelu kernel computes it (tanh: approximate=tanh), for the linear kernels' fused GELU.
void gelu(const TensorView& x, const TensorView& y, bool tanh);
void gelu_grad(const KernelCtx& c);
// (dy, x) -> (dx, db): gelu_grad's dx, and db = dx summed over every leading axis (a linear's bias gradient:
// graph/passes.cc fuse_bias_gradients), bit for bit what reduce_sum computes from the stored dx.
void gelu_bias_grad(const KernelCtx& c);
// The same for relu_grad: (dy, y) -> (dx, db).
void relu_bias_grad(const KernelCtx& c);
void silu(const KernelCtx& c);
void silu_grad(const KernelCtx& c);
// (g, u) -> silu(g) u, and (dh, g, u) -> (dg, du): the unfused silu -> mul's bits in one pass.
void swiglu(const KernelCtx& c);
void swiglu_grad(const KernelCtx& c);
void tanh(const KernelCtx& c);
void tanh_grad(const KernelCtx& c);
void sigmoid(const KernelCtx& c);
void sigmoid_grad(const KernelCtx& c);
void fill_like(const KernelCtx& c);
void copy(const KernelCtx& c);
void cast(const KernelCtx& c);
// n elements from one dtype to another (f16/bf16 rounded to nearest-even), in parallel; the cast kernel and
// the executor's widened f16/bf16 kernels use it.
void convert(const void* src, DType from, void* dst, DType to, int64_t n);

}  // namespace flowrun::cpu
