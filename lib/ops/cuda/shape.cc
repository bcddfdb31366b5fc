// Shape ops on the device: slice, its gradient, concat and split are strided row copies around the axis
// (the tensor as [outer, len, inner]), done by cudaMemcpy2DAsync; slice_at, whose start only the device
// knows, by a kernel (decode.cu).
#include "ops/cpu/shape.h"  // resolve_slice: the bounds the CPU and shape inference use

#include <climits>

#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace flowrun::cuda {

namespace {

struct Around {
  int64_t outer = 1, len = 1, row = 1;  // row: bytes of one index of the axis (inner elements)
};

Around around(const TensorView& t, int64_t axis_attr) {
  const int64_t r = static_cast<int64_t>(t.rank());
  const int64_t axis = axis_attr < 0 ? axis_attr + r : axis_attr;
  FR_CHECK(axis >= 0 && axis < r, "axis ", axis_attr, " out of range for rank ", r);
  Around a;
  for (int64_t i = 0; i < axis; ++i) a.outer *= t.dim(static_cast<int>(i));
  a.len = t.dim(static_cast<int>(axis));
  a.row = static_cast<int64_t>(dtype_size(t.dtype));
  for (int64_t i = axis + 1; i < r; ++i) a.row *= t.dim(static_cast<int>(i));
  return a;
}

// `height` rows of `width` bytes from src (rows src_pitch apart) to dst (dst_pitch apart).
void copy_rows(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width,
               int64_t height, cudaStream_t s) {
  if (width == 0 || height == 0) return;
  check(
      cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_pitch), src, static_cast<size_t>(src_pitch),
                        static_cast<size_t>(width), static_cast<size_t>(height), cudaMemcpyDeviceToDevice, s),
      "cudaMemcpy2DAsync");
}

char* bytes(const TensorView& t) {
  return static_cast<char*>(t.data);
}

}  // namespace

void slice(const KernelCtx& c) {
  const Around a = around(c.in[0], c.attrs().i("axis"));
  const auto [start, end] = cpu::resolve_slice(c.attrs().i("start", 0), c.attrs().i("end", INT64_MAX), a.len);
  copy_rows(c.out[0].data, (end - start) * a.row, bytes(c.in[0]) + start * a.row, a.len * a.row,
            (end - start) * a.row, a.outer, stream_of(c));
}

void slice_at(const KernelCtx& c) {
  const Around a = around(c.in[0], c.attrs().i("axis"));
  const int64_t len = c.attrs().i("length");
  cuda::slice_at(c.in[0].data, c.out[0].data, c.in[1].as<int64_t>(), a.outer, len, a.len, a.row,
                 stream_of(c));
}

void slice_grad(const KernelCtx& c) {
  const TensorView& dx = c.out[0];
  const Around a = around(dx, c.attrs().i("axis"));
  const auto [start, end] = cpu::resolve_slice(c.attrs().i("start"), c.attrs().i("end"), a.len);
  check(cudaMemsetAsync(dx.data, 0, static_cast<size_t>(dx.numel()) * dtype_size(dx.dtype), stream_of(c)),
        "cudaMemsetAsync");
  copy_rows(bytes(dx) + start * a.row, a.len * a.row, c.in[0].data, (end - start) * a.row,
            (end - start) * a.row, a.outer, stream_of(c));
}

void concat(const KernelCtx& c) {
  const Around a = around(c.out[0], c.attrs().i("axis"));
  int64_t offset = 0;
  for (int k = 0; k < c.num_in; ++k) {
    const int64_t width = around(c.in[k], c.attrs().i("axis")).len * a.row;
    copy_rows(bytes(c.out[0]) + offset, a.len * a.row, c.in[k].data, width, width, a.outer, stream_of(c));
    offset += width;
  }
}

void split(const KernelCtx& c) {
  const Around a = around(c.in[0], c.attrs().i("axis"));
  int64_t offset = 0;
  for (int k = 0; k < c.num_out; ++k) {
    const int64_t width = around(c.out[k], c.attrs().i("axis")).len * a.row;
    copy_rows(c.out[k].data, width, bytes(c.in[0]) + offset, a.len * a.row, width, a.outer, stream_of(c));
    offset += width;
  }
}

}  // namespace flowrun::cuda
