// Software prefetch for the streaming kernels whose loops do real arithmetic per element (GELU and its
// gradient, the row norms, reductions over rows). With the hardware prefetchers alone such a loop's loads
// still wait on L2 or L3: GELU's forward over gpt-tiny's 8 MiB activations took 0.36 ms at 2 threads, the
// same loop asking for the line 2 KiB ahead into L1 0.30 ms, a plain copy's time (operands in L3; 1-8 KiB
// ran alike). In gpt-tiny's step (profiled, three runs of each build, alternating), per step:
//   fp32: gelu_bias_grad 3.3 -> 2.3 ms, gelu 2.35 -> 2.08, layernorm_grad 2.5 -> 2.0, layernorm 2.2 -> 2.0,
//         reduce_sum 1.22 -> 0.97;
//   bf16: gelu_bias_grad 3.3 -> 2.4, gelu 2.67 -> 1.68, layernorm_grad 2.77 -> 2.28, layernorm 2.15 -> 1.72,
//         reduce_sum 0.99 -> 0.66.
// AdamW (light arithmetic on four streams) ran slower with it, 2.1 -> 2.5 ms, and goes without.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flowrun::cpu {

constexpr std::uintptr_t kPrefetchAhead = 2048;  // bytes

// Asks for the cache line kPrefetchAhead bytes past `p` (for reading). A prefetch never faults, so the loop's
// last iterations may name lines past the end of its tensor; the address is formed as an integer, not by
// pointer arithmetic out of the array.
inline void prefetch_ahead(const void* p) {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(p) + kPrefetchAhead), 0,
                     3);
}

// The same for a line the loop will write: asked for ownership early, its read-for-ownership from memory
// overlaps the arithmetic. f32 GELU's forward in gpt-tiny's step: 2.36-2.68 -> 2.07-2.29 ms (six alternating
// runs); its gradient, which reads two streams, and the bf16 loops, which write half as many lines, did not
// move, and the bf16 loops go without.
inline void prefetch_ahead_for_write(void* p) {
  __builtin_prefetch(reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(p) + kPrefetchAhead), 1, 3);
}

// Every cache line of [p, p + bytes), `p` an address formed as an integer where it may lie past a tensor.
inline void prefetch_span(std::uintptr_t p, std::size_t bytes) {
  for (std::size_t off = 0; off < bytes; off += 64)
    __builtin_prefetch(reinterpret_cast<const void*>(p + off), 0, 3);
}

// prefetch_ahead for every cache line of [p, p + bytes): a row loop asks at the start of each row for the
// stretch of its input that lies as far ahead, so that a row of any length streams like the element loops.
inline void prefetch_span_ahead(const void* p, std::size_t bytes) {
  prefetch_span(reinterpret_cast<std::uintptr_t>(p) + kPrefetchAhead, bytes);
}

}  // namespace flowrun::cpu
