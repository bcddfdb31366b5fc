// all_reduce on CPU tensors: pack the bucket, one collective through the communicator, unpack scaled.
#include "ops/cpu/comm.h"

#include <cstring>

#include "ops/cpu/parallel.h"
#include "parallel/comm.h"

namespace flowrun::cpu {

void all_reduce(const KernelCtx& c) {
  const DType t = c.in[0].dtype;
  const size_t esize = dtype_size(t);
  const bool packed = c.num_in > 1;
  char* buf = static_cast<char*>(packed ? c.workspace : c.out[0].data);
  int64_t total = 0;
  for (int i = 0; i < c.num_in; ++i) {
    const size_t bytes = static_cast<size_t>(c.in[i].numel()) * esize;
    if (buf + total * static_cast<int64_t>(esize) != c.in[i].data)
      std::memmove(buf + total * static_cast<int64_t>(esize), c.in[i].data, bytes);
    total += c.in[i].numel();
  }
  if (c.comm) c.comm->all_reduce(buf, total, t, ReduceOp::sum);
  const double scale = c.attrs().f("scale", 1.0);
  int64_t at = 0;
  for (int i = 0; i < c.num_out; ++i) {
    const int64_t n = c.out[i].numel();
    dispatch_float(t, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      const T* src = reinterpret_cast<const T*>(buf) + at;
      T* dst = c.out[i].as<T>();
      const T k = static_cast<T>(scale);
      parallel_for(n, 1 << 14, [&](int64_t s, int64_t e) {
        for (int64_t j = s; j < e; ++j) dst[j] = src[j] * k;
      });
    });
    at += n;
  }
}

}  // namespace flowrun::cpu
