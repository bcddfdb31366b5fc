// Helpers shared by CPU kernels: OpenMP loops with static scheduling (deterministic for a fixed thread count)
// and dtype dispatch.
#pragma once

#include <omp.h>

#include <array>
#include <cstdint>
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
