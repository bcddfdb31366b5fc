// The collectives on CPU tensors: pack a bucket, one transfer through the communicator, unpack scaled; the
// ZeRO shards; the tensor axis's boxing.
#include "ops/cpu/comm.h"

#include <algorithm>
#include <cstring>

#include "ops/cpu/parallel.h"
#include "parallel/comm.h"
#include "parallel/sbp.h"

namespace flowrun::cpu {

namespace {

// The outputs, in order, from a packed bucket (of the dtype of input 0), times `scale`.
void unpack_scaled(const KernelCtx& c, const void* bucket, double scale) {
  int64_t at = 0;
  for (int i = 0; i < c.num_out; ++i) {
    const int64_t n = c.out[i].numel();
    dispatch_float(c.in[0].dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      const T* src = static_cast<const T*>(bucket) + at;
      T* dst = c.out[i].as<T>();
      const T k = static_cast<T>(scale);
      parallel_for(n, 1 << 14, [&](int64_t s, int64_t e) {
        for (int64_t j = s; j < e; ++j) dst[j] = src[j] * k;
      });
    });
    at += n;
  }
}

}  // namespace

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
  Communicator* group = c.attrs().is("group", "ends") ? c.ends : c.comm;
  if (group) group->all_reduce(buf, total, t, ReduceOp::sum);
  unpack_scaled(c, buf, c.attrs().f("scale", 1.0));
}

// The shards attribute must be the data axis's size: a program sharded for D ranks runs only on D ranks.
void check_shards(const KernelCtx& c) {
  const int64_t world = c.comm ? c.comm->size() : 1;
  FR_CHECK(c.attrs().i("shards") == world, c.node->name, ": sharded ", c.attrs().i("shards"), " ways on ",
           world, " ranks");
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

namespace {
// Every rank's flat shard of `shard`, in rank order, into dst (n elements: the padding dropped).
void gather_to(const KernelCtx& c, const TensorView& dst, const TensorView& shard) {
  check_shards(c);
  const int64_t n = dst.numel(), s = shard.numel();
  const size_t esize = dtype_size(dst.dtype);
  if (!c.comm || c.comm->size() == 1) {
    std::memcpy(dst.data, shard.data, static_cast<size_t>(n) * esize);
    return;
  }
  c.comm->all_gather(shard.data, c.workspace, s, dst.dtype);
  std::memcpy(dst.data, c.workspace, static_cast<size_t>(n) * esize);
}
}  // namespace

void all_gather_into(const KernelCtx& c) {
  gather_to(c, c.in[0], c.in[1]);
}
void gather_shards(const KernelCtx& c) {
  gather_to(c, c.out[0], c.in[0]);
}

void all_reduce_start(const KernelCtx& c) {
  const size_t esize = dtype_size(c.in[0].dtype);
  char* bucket = static_cast<char*>(c.out[0].data);
  int64_t at = 0;
  for (int i = 0; i < c.num_in; ++i) {
    std::memcpy(bucket + at * static_cast<int64_t>(esize), c.in[i].data,
                static_cast<size_t>(c.in[i].numel()) * esize);
    at += c.in[i].numel();
  }
  *c.out[1].as<int64_t>() = c.comm ? c.comm->start_all_reduce(bucket, at, c.in[0].dtype, ReduceOp::sum) : -1;
}

void all_reduce_wait(const KernelCtx& c) {
  const int64_t handle = *c.in[1].as<int64_t>();
  if (c.comm && handle >= 0) c.comm->wait(handle);
  unpack_scaled(c, c.in[0].data, c.attrs().f("scale", 1.0));
}

void reduce_scatter_shard(const KernelCtx& c) {
  check_shards(c);
  const int64_t n = c.in[0].numel(), s = c.out[0].numel(), shards = c.attrs().i("shards");
  const DType t = c.in[0].dtype;
  const size_t esize = dtype_size(t);
  // The whole gradient, zero-padded to shards x s, reduced; this rank receives its s elements.
  char* buf = static_cast<char*>(c.workspace);
  std::memcpy(buf, c.in[0].data, static_cast<size_t>(n) * esize);
  std::memset(buf + n * static_cast<int64_t>(esize), 0, static_cast<size_t>(s * shards - n) * esize);
  if (c.comm && c.comm->size() > 1)
    c.comm->reduce_scatter(buf, c.out[0].data, s, t, ReduceOp::sum);
  else
    std::memcpy(c.out[0].data, buf, static_cast<size_t>(s) * esize);
  const double scale = c.attrs().f("scale", 1.0);
  dispatch_float(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* y = c.out[0].as<T>();
    for (int64_t i = 0; i < s; ++i) y[i] = static_cast<T>(y[i] * static_cast<T>(scale));
  });
}

}  // namespace flowrun::cpu

namespace flowrun::cpu {

namespace {

// A tensor split over a mesh axis as [outer, parts, chunk] (parallel/sbp.h): copies rank-major blocks
// [parts][outer][chunk] (as collectives move them) to and from the interleaved layout.
struct Blocks {
  int64_t outer, chunk, parts;
  size_t esize;
};

Blocks blocks_of(const KernelCtx& c, const Shape& whole) {
  const int64_t parts = c.attrs().i("parts");
  const Sbp s = Sbp::split(static_cast<int>(c.attrs().i("axis")), static_cast<int>(c.attrs().i("groups", 1)));
  const SplitView v = split_view(whole, s, parts);
  return {v.outer, v.chunk, parts, dtype_size(c.in[0].dtype)};
}

void rank_major_to_whole(const Blocks& b, const char* src, char* dst) {
  const size_t row = static_cast<size_t>(b.chunk) * b.esize;
  for (int64_t r = 0; r < b.parts; ++r)
    for (int64_t o = 0; o < b.outer; ++o)
      std::memcpy(dst + static_cast<size_t>(o * b.parts + r) * row,
                  src + static_cast<size_t>(r * b.outer + o) * row, row);
}

void whole_to_rank_major(const Blocks& b, const char* src, char* dst) {
  const size_t row = static_cast<size_t>(b.chunk) * b.esize;
  for (int64_t r = 0; r < b.parts; ++r)
    for (int64_t o = 0; o < b.outer; ++o)
      std::memcpy(dst + static_cast<size_t>(r * b.outer + o) * row,
                  src + static_cast<size_t>(o * b.parts + r) * row, row);
}

// The group of the mesh axis the op boxes on (attr mesh: "data" or "tensor"); null in one process.
Communicator* group_of(const KernelCtx& c) {
  return c.attrs().is("mesh", "data") ? c.comm : c.tp;
}

// The group must have as many ranks as the program was split for.
int axis_rank(const KernelCtx& c) {
  Communicator* g = group_of(c);
  const int64_t size = g ? g->size() : 1;
  FR_CHECK(c.attrs().i("parts") == size, c.node->name, ": split ", c.attrs().i("parts"), " ways on a ",
           c.attrs().s("mesh"), " axis of ", size, " ranks");
  return g ? g->rank() : 0;
}

}  // namespace

void sbp_all_reduce(const KernelCtx& c) {
  axis_rank(c);
  Communicator* g = group_of(c);
  if (c.out[0].data != c.in[0].data)
    std::memcpy(c.out[0].data, c.in[0].data, c.out[0].numel() * dtype_size(c.in[0].dtype));
  if (g) g->all_reduce(c.out[0].data, c.out[0].numel(), c.in[0].dtype, ReduceOp::sum);
}

void sbp_copy(const KernelCtx& c) {
  if (c.out[0].data != c.in[0].data)
    std::memcpy(c.out[0].data, c.in[0].data, c.out[0].numel() * dtype_size(c.in[0].dtype));
}

void sbp_all_gather(const KernelCtx& c) {
  axis_rank(c);
  Communicator* g = group_of(c);
  const Blocks b = blocks_of(c, *c.out[0].shape);
  if (!g) {
    std::memcpy(c.out[0].data, c.in[0].data, static_cast<size_t>(c.out[0].numel()) * b.esize);
    return;
  }
  g->all_gather(c.in[0].data, c.workspace, c.in[0].numel(), c.in[0].dtype);
  rank_major_to_whole(b, static_cast<const char*>(c.workspace), static_cast<char*>(c.out[0].data));
}

void sbp_slice(const KernelCtx& c) {
  const int r = axis_rank(c);
  const Blocks b = blocks_of(c, *c.in[0].shape);
  const size_t row = static_cast<size_t>(b.chunk) * b.esize;
  const char* src = static_cast<const char*>(c.in[0].data);
  char* dst = static_cast<char*>(c.out[0].data);
  for (int64_t o = 0; o < b.outer; ++o)
    std::memcpy(dst + static_cast<size_t>(o) * row, src + static_cast<size_t>(o * b.parts + r) * row, row);
}

void sbp_reduce_scatter(const KernelCtx& c) {
  axis_rank(c);
  Communicator* g = group_of(c);
  const Blocks b = blocks_of(c, *c.in[0].shape);
  if (!g) {
    std::memcpy(c.out[0].data, c.in[0].data, static_cast<size_t>(c.out[0].numel()) * b.esize);
    return;
  }
  whole_to_rank_major(b, static_cast<const char*>(c.in[0].data), static_cast<char*>(c.workspace));
  g->reduce_scatter(c.workspace, c.out[0].data, c.out[0].numel(), c.in[0].dtype, ReduceOp::sum);
}

}  // namespace flowrun::cpu
