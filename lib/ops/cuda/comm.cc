// The collective ops on the GPU (the CPU's in ops/cpu/comm.cc, step for step): buckets packed and unpacked
// with device copies, the transfers through the NCCL communicators of parallel/cuda/nccl.h, enqueued on the
// kernel stream so that a CUDA graph captures them with the kernels.
#include <algorithm>
#include <map>
#include <mutex>

#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"
#include "parallel/cuda/nccl.h"
#include "parallel/sbp.h"

namespace flowrun::cuda {

// The NCCL communicator of a group, set to launch on the kernel's stream; null for a one-rank group (every
// collective is then the identity, as the single-process communicator's).
Communicator* on_stream(Communicator* g, const KernelCtx& c) {
  if (!g || g->size() == 1) return nullptr;
  auto* n = dynamic_cast<NcclCommunicator*>(g);
  FR_CHECK(n != nullptr, c.node->name, ": collectives between GPUs go through NCCL, not ", g->backend());
  n->set_stream(c.stream);
  return n;
}

namespace {

char* at(void* p, int64_t elements, size_t esize) {
  return static_cast<char*>(p) + elements * static_cast<int64_t>(esize);
}

void copy(void* dst, const void* src, size_t bytes, const KernelCtx& c) {
  if (dst != src && bytes > 0)
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_of(c)), "cudaMemcpyAsync");
}

// y = x * scale over n elements of c's first input's dtype (a copy when scale is 1).
void scaled(const void* x, void* y, int64_t n, double scale, const KernelCtx& c) {
  if (scale == 1.0)
    copy(y, x, static_cast<size_t>(n) * dtype_size(c.in[0].dtype), c);
  else if (n > 0)
    unary(UnaryOp::mul_scalar, storage_of(c.in[0].dtype), x, y, n, static_cast<float>(scale), stream_of(c));
}

// The outputs, in order, from a packed bucket, times `scale`.
void unpack_scaled(const KernelCtx& c, void* bucket, double scale) {
  int64_t done = 0;
  for (int i = 0; i < c.num_out; ++i) {
    scaled(at(bucket, done, dtype_size(c.in[0].dtype)), c.out[i].data, c.out[i].numel(), scale, c);
    done += c.out[i].numel();
  }
}

// The inputs, in order, into `bucket`; returns the element count.
int64_t pack(const KernelCtx& c, void* bucket) {
  const size_t esize = dtype_size(c.in[0].dtype);
  int64_t total = 0;
  for (int i = 0; i < c.num_in; ++i) {
    copy(at(bucket, total, esize), c.in[i].data, static_cast<size_t>(c.in[i].numel()) * esize, c);
    total += c.in[i].numel();
  }
  return total;
}

void check_shards(const KernelCtx& c) {
  const int64_t world = c.comm ? c.comm->size() : 1;
  FR_CHECK(c.attrs().i("shards") == world, c.node->name, ": sharded ", c.attrs().i("shards"), " ways on ",
           world, " ranks");
}

// Started all-reduces by bucket address: all_reduce_wait finds its transfer from the bucket it is given
// (the handle value lives in device memory, which the host does not read).
std::mutex pending_mutex;
std::map<const void*, int64_t> pending;

}  // namespace

void all_reduce(const KernelCtx& c) {
  void* buf = c.num_in > 1 ? c.workspace : c.out[0].data;
  const int64_t total = pack(c, buf);
  Communicator* group = on_stream(c.attrs().is("group", "ends") ? c.ends : c.comm, c);
  if (group) group->all_reduce(buf, total, c.in[0].dtype, ReduceOp::sum);
  unpack_scaled(c, buf, c.attrs().f("scale", 1.0));
}

void local_shard(const KernelCtx& c) {
  check_shards(c);
  const int64_t n = c.in[0].numel(), s = c.out[0].numel();
  const int64_t first = (c.comm ? c.comm->rank() : 0) * s;
  const size_t esize = dtype_size(c.in[0].dtype);
  const int64_t have = std::clamp<int64_t>(n - first, 0, s);
  copy(c.out[0].data, at(c.in[0].data, first, esize), static_cast<size_t>(have) * esize, c);
  if (have < s)
    check(cudaMemsetAsync(at(c.out[0].data, have, esize), 0, static_cast<size_t>(s - have) * esize,
                          stream_of(c)),
          "cudaMemsetAsync");
}

namespace {
// Every rank's flat shard of `shard`, in rank order, into dst (n elements: the padding dropped).
void gather_to(const KernelCtx& c, const TensorView& dst, const TensorView& shard) {
  check_shards(c);
  const int64_t n = dst.numel(), s = shard.numel();
  const size_t esize = dtype_size(dst.dtype);
  Communicator* g = on_stream(c.comm, c);
  if (!g) {
    copy(dst.data, shard.data, static_cast<size_t>(n) * esize, c);
    return;
  }
  g->all_gather(shard.data, c.workspace, s, dst.dtype);
  copy(dst.data, c.workspace, static_cast<size_t>(n) * esize, c);
}
}  // namespace

void all_gather_into(const KernelCtx& c) {
  gather_to(c, c.in[0], c.in[1]);
}
void gather_shards(const KernelCtx& c) {
  gather_to(c, c.out[0], c.in[0]);
}

void all_reduce_start(const KernelCtx& c) {
  void* bucket = c.out[0].data;
  const int64_t total = pack(c, bucket);
  // The handle stays on the host (see pending); the value says "none", as the CPU kernel's in one process.
  check(cudaMemsetAsync(c.out[1].data, 0xff, sizeof(int64_t), stream_of(c)), "cudaMemsetAsync");
  if (Communicator* g = on_stream(c.comm, c)) {
    const int64_t handle = g->start_all_reduce(bucket, total, c.in[0].dtype, ReduceOp::sum);
    std::lock_guard<std::mutex> lock(pending_mutex);
    pending[bucket] = handle;
  }
}

void all_reduce_wait(const KernelCtx& c) {
  if (Communicator* g = on_stream(c.comm, c)) {
    int64_t handle = -1;
    {
      std::lock_guard<std::mutex> lock(pending_mutex);
      auto it = pending.find(c.in[0].data);
      FR_CHECK(it != pending.end(), c.node->name, ": no all-reduce was started on its bucket");
      handle = it->second;
      pending.erase(it);
    }
    g->wait(handle);
  }
  unpack_scaled(c, c.in[0].data, c.attrs().f("scale", 1.0));
}

void reduce_scatter_shard(const KernelCtx& c) {
  check_shards(c);
  const int64_t n = c.in[0].numel(), s = c.out[0].numel(), shards = c.attrs().i("shards");
  const DType t = c.in[0].dtype;
  const size_t esize = dtype_size(t);
  // The whole gradient, zero-padded to shards x s, reduced; this rank receives its s elements.
  void* buf = c.workspace;
  copy(buf, c.in[0].data, static_cast<size_t>(n) * esize, c);
  if (s * shards > n)
    check(cudaMemsetAsync(at(buf, n, esize), 0, static_cast<size_t>(s * shards - n) * esize, stream_of(c)),
          "cudaMemsetAsync");
  if (Communicator* g = on_stream(c.comm, c)) {
    g->reduce_scatter(buf, c.out[0].data, s, t, ReduceOp::sum);
    scaled(c.out[0].data, c.out[0].data, s, c.attrs().f("scale", 1.0), c);
  } else {
    scaled(buf, c.out[0].data, s, c.attrs().f("scale", 1.0), c);
  }
}

namespace {

// A tensor split over a mesh axis as [outer, parts, chunk] (parallel/sbp.h), moved by collectives in
// rank-major blocks [parts][outer][chunk]: each rank's block is one strided 2-d copy.
struct Blocks {
  int64_t outer, chunk, parts;
  size_t row;  // bytes of a chunk
};

Blocks blocks_of(const KernelCtx& c, const Shape& whole) {
  const int64_t parts = c.attrs().i("parts");
  const Sbp s = Sbp::split(static_cast<int>(c.attrs().i("axis")), static_cast<int>(c.attrs().i("groups", 1)));
  const SplitView v = split_view(whole, s, parts);
  return {v.outer, v.chunk, parts, static_cast<size_t>(v.chunk) * dtype_size(c.in[0].dtype)};
}

// Rank r's block: the rows [r * outer, (r + 1) * outer) of the rank-major side, every parts-th row from row
// r of the interleaved side.
void copy_block(const Blocks& b, int64_t r, bool to_interleaved, void* interleaved, void* rank_major,
                const KernelCtx& c) {
  if (b.row == 0 || b.outer == 0) return;
  char* il = static_cast<char*>(interleaved) + static_cast<size_t>(r) * b.row;
  char* rm = static_cast<char*>(rank_major) + static_cast<size_t>(r * b.outer) * b.row;
  const size_t il_pitch = static_cast<size_t>(b.parts) * b.row;
  const cudaError_t e = to_interleaved
                            ? cudaMemcpy2DAsync(il, il_pitch, rm, b.row, b.row, static_cast<size_t>(b.outer),
                                                cudaMemcpyDeviceToDevice, stream_of(c))
                            : cudaMemcpy2DAsync(rm, b.row, il, il_pitch, b.row, static_cast<size_t>(b.outer),
                                                cudaMemcpyDeviceToDevice, stream_of(c));
  check(e, "cudaMemcpy2DAsync");
}

Communicator* axis_group(const KernelCtx& c, int* rank) {
  Communicator* g = c.attrs().is("mesh", "data") ? c.comm : c.tp;
  const int64_t size = g ? g->size() : 1;
  FR_CHECK(c.attrs().i("parts") == size, c.node->name, ": split ", c.attrs().i("parts"), " ways on a ",
           c.attrs().s("mesh"), " axis of ", size, " ranks");
  *rank = g ? g->rank() : 0;
  return on_stream(g, c);
}

}  // namespace

void sbp_all_reduce(const KernelCtx& c) {
  int r = 0;
  Communicator* g = axis_group(c, &r);
  copy(c.out[0].data, c.in[0].data, static_cast<size_t>(c.out[0].numel()) * dtype_size(c.in[0].dtype), c);
  if (g) g->all_reduce(c.out[0].data, c.out[0].numel(), c.in[0].dtype, ReduceOp::sum);
}

void sbp_copy(const KernelCtx& c) {
  copy(c.out[0].data, c.in[0].data, static_cast<size_t>(c.out[0].numel()) * dtype_size(c.in[0].dtype), c);
}

void sbp_all_gather(const KernelCtx& c) {
  int r = 0;
  Communicator* g = axis_group(c, &r);
  if (!g) {
    sbp_copy(c);
    return;
  }
  const Blocks b = blocks_of(c, *c.out[0].shape);
  g->all_gather(c.in[0].data, c.workspace, c.in[0].numel(), c.in[0].dtype);
  for (int64_t k = 0; k < b.parts; ++k) copy_block(b, k, true, c.out[0].data, c.workspace, c);
}

void sbp_slice(const KernelCtx& c) {
  int r = 0;
  axis_group(c, &r);
  const Blocks b = blocks_of(c, *c.in[0].shape);
  // This rank's rows of the interleaved input, packed into the output.
  if (b.row == 0 || b.outer == 0) return;
  check(cudaMemcpy2DAsync(c.out[0].data, b.row, static_cast<const char*>(c.in[0].data) + r * b.row,
                          static_cast<size_t>(b.parts) * b.row, b.row, static_cast<size_t>(b.outer),
                          cudaMemcpyDeviceToDevice, stream_of(c)),
        "cudaMemcpy2DAsync");
}

void sbp_reduce_scatter(const KernelCtx& c) {
  int r = 0;
  Communicator* g = axis_group(c, &r);
  if (!g) {
    sbp_copy(c);
    return;
  }
  const Blocks b = blocks_of(c, *c.in[0].shape);
  for (int64_t k = 0; k < b.parts; ++k) copy_block(b, k, false, c.in[0].data, c.workspace, c);
  g->reduce_scatter(c.workspace, c.out[0].data, c.out[0].numel(), c.in[0].dtype, ReduceOp::sum);
}

}  // namespace flowrun::cuda
