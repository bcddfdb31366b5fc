// Helpers shared by CPU kernels: OpenMP loops with static scheduling (deterministic for a fixed thread
// count), one that hands units out to whichever thread is free (for units whose results do not depend on the
// thread), and dtype dispatch.
#pragma once

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include "core/dtype.h"
#include "core/error.h"

namespace flowrun::cpu {

// Runs f(begin, end) over [0, n) split into equal contiguous chunks, one per thread; small n runs inline.
template <typename F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  if (n <= grain || omp_get_max_threads() == 1 || omp_in_parallel()) {
    f(int64_t{0}, n);
    return;
  }
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t chunk = (n + nt - 1) / nt;
    const int64_t b = t * chunk, e = b + chunk < n ? b + chunk : n;
    if (b < e) f(b, e);
  }
}

// Runs f(u) once for every u in [0, n), on any thread and in any order: for work whose units give the same
// result whichever thread runs them (gemm_avx2's tiles). Each thread starts on its own contiguous share,
// front to back; one that finishes takes units one at a time from the back of the shares not yet done. With
// equal static shares a short last unit, or a core the hypervisor or another process takes for a while, left
// the other thread waiting at the region's end (on the 2 vCPU Zen 3 host, in slow minutes, libgomp's wait
// loop held 8% of gpt-tiny's step's samples and 14% of its products' in flowrun_bench).
template <typename F>
void parallel_for_units(int64_t n, F&& f) {
  const int nt = omp_get_max_threads();
  if (n <= 1 || nt == 1 || omp_in_parallel()) {
    for (int64_t u = 0; u < n; ++u) f(u);
    return;
  }
  FR_CHECK(n < (int64_t{1} << 31), "parallel_for_units: ", n, " units");
  // A share's next unit (low 32 bits) and its end (high 32 bits) in one word, so that its owner (taking from
  // the front) and a thief (from the back) never both take its last unit.
  struct alignas(64) Share {
    std::atomic<uint64_t> range;
  };
  // Grown once per calling thread: a step allocates nothing (tests/alloc).
  thread_local std::unique_ptr<Share[]> held;
  thread_local int held_n = 0;
  if (held_n < nt) {
    held = std::make_unique<Share[]>(static_cast<size_t>(nt));
    held_n = nt;
  }
  Share* shares = held.get();
  const int64_t chunk = (n + nt - 1) / nt;
  for (int s = 0; s < nt; ++s) {
    const auto b = static_cast<uint64_t>(std::min<int64_t>(s * chunk, n)),
               e = static_cast<uint64_t>(std::min<int64_t>((s + 1) * chunk, n));
    shares[static_cast<size_t>(s)].range.store(b | e << 32, std::memory_order_relaxed);
  }
  constexpr uint64_t kLow = 0xffffffffu;
#pragma omp parallel
  {
    const int t = omp_get_thread_num();
    // Its own share first (a team smaller than nt leaves shares to be taken from the back), then the others'.
    for (int i = 0; i < nt; ++i) {
      std::atomic<uint64_t>& r = shares[static_cast<size_t>((t + i) % nt)].range;
      uint64_t w = r.load(std::memory_order_relaxed);
      while ((w & kLow) < (w >> 32)) {
        const uint64_t took = i == 0 ? w + 1 : w - (uint64_t{1} << 32);
        if (!r.compare_exchange_weak(w, took, std::memory_order_relaxed)) continue;
        f(static_cast<int64_t>(i == 0 ? w & kLow : (w >> 32) - 1));
        w = r.load(std::memory_order_relaxed);
      }
    }
  }
}

// The OpenMP thread count is 1 while this is alive: oneDNN primitive descriptors made meanwhile plan for one
// thread (oneDNN reads the count when it builds them), so that their sums do not depend on train.threads.
class OneThread {
 public:
  OneThread() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(saved_); }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int saved_;
};

// {make(1), ..., make(N)}, each argument a std::integral_constant<int, i>: a table of a kernel template's
// instances for a size known only at run time (entry i - 1 for size i).
template <typename Fn, int N, typename Make>
constexpr std::array<Fn, N> kernel_table(Make make) {
  return [&]<int... I>(std::integer_sequence<int, I...>) {
    return std::array<Fn, N>{make(std::integral_constant<int, I + 1>{})...};
  }
  (std::make_integer_sequence<int, N>{});
}

// Calls f with a typed null pointer (float* or double*) matching a floating compute dtype.
template <typename F>
void dispatch_float(DType t, F&& f) {
  switch (t) {
    case DType::f32: f(static_cast<float*>(nullptr)); break;
    case DType::f64: f(static_cast<double*>(nullptr)); break;
    default: FR_CHECK(false, "no CPU kernel for dtype ", dtype_name(t));
  }
}

}  // namespace flowrun::cpu
