// CPU kernel of the rotary position embedding (ops/attention.cc): Hugging Face's rotate_half convention,
// pair (i, i + D/2) of each row of x (B, H, T, D) rotated by the angle of (offset + t, i).
//
// The cos/sin of every (t, i) are computed once into the workspace (T x D of the kernel's type: cos in the
// first half of a row, sin in the second, sin negated for the inverse rotation), then every (batch, head)
// row reads its position's table row: the B x H rows share T x D/2 pairs of trigonometric calls.
#include <algorithm>
#include <cmath>

#include "ops/cpu/attention.h"
#include "ops/cpu/parallel.h"

namespace flowrun::cpu {

void rope(const KernelCtx& c) {
  dispatch_float(c.in[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const TensorView& xv = c.in[0];
    const int64_t rows = xv.dim(0) * xv.dim(1), len = xv.dim(2), d = xv.dim(3), half = d / 2;
    const double theta = c.attrs().f("theta", 10000.0);
    const int64_t offset = c.attrs().i("offset", 0) + (c.num_in == 2 ? c.in[1].as<int64_t>()[0] : 0);
    const T sign = c.attrs().b("inverse", false) ? T(-1) : T(1);
    FR_CHECK(c.workspace_bytes >= static_cast<size_t>(len * d) * sizeof(T), "rope workspace too small");
    T* table = static_cast<T*>(c.workspace);
    parallel_for(len, 16, [&](int64_t s, int64_t e) {
      for (int64_t t = s; t < e; ++t)
        for (int64_t i = 0; i < half; ++i) {
          const double a = static_cast<double>(rope_angle(offset + t, i, d, theta));
          table[t * d + i] = static_cast<T>(std::cos(a));
          table[t * d + half + i] = sign * static_cast<T>(std::sin(a));
        }
    });
    const T* x = xv.as<T>();
    T* y = c.out[0].as<T>();  // may be x: each pair is read whole before it is written
    parallel_for(rows * len, std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1)),
                 [&](int64_t s, int64_t e) {
                   for (int64_t r = s; r < e; ++r) {
                     const T* cs = table + (r % len) * d;
                     const T* sn = cs + half;
                     const T* xr = x + r * d;
                     T* yr = y + r * d;
#pragma omp simd
                     for (int64_t i = 0; i < half; ++i) {
                       const T a = xr[i], b = xr[i + half];
                       yr[i] = a * cs[i] - b * sn[i];
                       yr[i + half] = b * cs[i] + a * sn[i];
                     }
                   }
                 });
  });
}

}  // namespace flowrun::cpu
