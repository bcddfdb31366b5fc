// bf16 matmul through oneDNN (kept in its own file: dnnl.hpp is heavy to compile).
#pragma once

#include <cstdint>

namespace flowrun::cpu {

// Row-major batched bf16 GEMM with f32 accumulation; a stride of 0 means the operand is shared by all batches.
void dnnl_matmul_bf16(int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb, int64_t a_stride,
                      int64_t b_stride, const void* a, const void* b, void* y);

}  // namespace flowrun::cpu
