// all_reduce on CPU tensors: pack the bucket, one collective through the communicator, unpack scaled.
#include "ops/cpu/comm.h"

#include <algorithm>
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

// The shards attribute must be the world's size: a program sharded for D ranks runs only on D ranks.
void check_shards(const KernelCtx& c) {
  const int64_t world = c.comm ? c.comm->size() : 1;
  FR_CHECK(c.attrs().i("shards") == world, c.node->name, ": sharded ", c.attrs().i("shards"), " ways on ", world,
           " ranks");
}

void local_shard(const KernelCtx& c) {
  check_shards(c);
  const int64_t n = c.in[0].numel(), s = c.out[0].numel();
  const int64_t first = (c.comm ? c.comm->rank() : 0) * s;
  const size_t esize = dtype_size(c.in[0].dtype);
  const int64_t have = std::clamp<int64_t>(n - first, 0, s);
  std::memcpy(c.out[0].data, static_cast<const char*>(c.in[0].data) + first * static_cast<int64_t>(esize),
              static_cast<size_t>(have) * esize);
  std::memset(static_cast<char*>(c.out[0].data) + have * static_cast<int64_t>(esize), 0,
              static_cast<size_t>(s - have) * esize);
}

void all_gather_into(const KernelCtx& c) {
  check_shards(c);
  const int64_t n = c.in[0].numel(), s = c.in[1].numel();
  const size_t esize = dtype_size(c.in[0].dtype);
  if (!c.comm || c.comm->size() == 1) {
    std::memcpy(c.in[0].data, c.in[1].data, static_cast<size_t>(n) * esize);
    return;
  }
  c.comm->all_gather(c.in[1].data, c.workspace, s, c.in[0].dtype);
  std::memcpy(c.in[0].data, c.workspace, static_cast<size_t>(n) * esize);
}

}  // namespace flowrun::cpu
