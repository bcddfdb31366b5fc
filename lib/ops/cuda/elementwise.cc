// KernelCtx adapters of the elementwise CUDA kernels (ops/cuda/elementwise.cu).
#include <algorithm>

#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace flowrun::cuda {

Storage storage_of(DType t) {
  switch (t) {
    case DType::f32:
      return Storage::f32;
    case DType::f16:
      return Storage::f16;
    case DType::bf16:
      return Storage::bf16;
    default:
      throw runtime_error(cat("the CUDA kernels store f32, f16 or bf16, not ", dtype_name(t)));
  }
}

cudaStream_t stream_of(const KernelCtx& c) {
  return static_cast<cudaStream_t>(c.stream);
}

void check_same_dtype(const KernelCtx& c, DType x, int first) {
  for (int i = first; i < c.num_in; ++i)
    FR_CHECK(c.in[i].dtype == x, c.node->name, ": the CUDA kernel needs input ", i, " in ", dtype_name(x),
             ", got ", dtype_name(c.in[i].dtype));
}

namespace {

void binary_op(const KernelCtx& c, BinaryOp op) {
  const TensorView &a = c.in[0], &b = c.in[1], &y = c.out[0];
  const int64_t n = y.numel();
  if (a.numel() == n && b.numel() == n) {
    binary(op, storage_of(y.dtype), a.data, b.data, y.data, n, nullptr, stream_of(c));
    return;
  }
  // numpy broadcasting: strides of 0 along the axes an input is stretched on (inputs aligned on the right).
  Broadcast bc;
  const Shape& ys = *y.shape;
  FR_CHECK(ys.size() <= 8, "broadcast of rank ", ys.size(), " is not supported");
  bc.rank = static_cast<int>(ys.size());
  auto strides = [&](const Shape& s, int64_t* out) {
    int64_t st = 1;
    for (size_t k = 0; k < ys.size(); ++k) {
      const size_t axis = ys.size() - 1 - k;
      const int64_t d = k < s.size() ? s[s.size() - 1 - k] : 1;
      out[axis] = d == 1 ? 0 : st;
      st *= d;
    }
  };
  strides(*a.shape, bc.stride_a);
  strides(*b.shape, bc.stride_b);
  std::copy(ys.begin(), ys.end(), bc.dims);
  binary(op, storage_of(y.dtype), a.data, b.data, y.data, n, &bc, stream_of(c));
}

void unary_op(const KernelCtx& c, UnaryOp op, float value = 0.0f) {
  unary(op, storage_of(c.out[0].dtype), c.in[0].data, c.out[0].data, c.out[0].numel(), value, stream_of(c));
}

void grad_op(const KernelCtx& c, GradOp op) {
  unary_grad(op, storage_of(c.out[0].dtype), c.in[0].data, c.in[1].data, c.out[0].data, c.out[0].numel(),
             stream_of(c));
}

bool tanh_approx(const KernelCtx& c) {
  return c.attrs().is("approximate", "tanh");
}

}  // namespace

void add(const KernelCtx& c) {
  binary_op(c, BinaryOp::add);
}
void sub(const KernelCtx& c) {
  binary_op(c, BinaryOp::sub);
}
void mul(const KernelCtx& c) {
  binary_op(c, BinaryOp::mul);
}
void div(const KernelCtx& c) {
  binary_op(c, BinaryOp::div);
}
void add_scalar(const KernelCtx& c) {
  unary_op(c, UnaryOp::add_scalar, static_cast<float>(c.attrs().f("value")));
}
void mul_scalar(const KernelCtx& c) {
  unary_op(c, UnaryOp::mul_scalar, static_cast<float>(c.attrs().f("value")));
}
void pow_scalar(const KernelCtx& c) {
  unary_op(c, UnaryOp::pow_scalar, static_cast<float>(c.attrs().f("value")));
}
void relu(const KernelCtx& c) {
  unary_op(c, UnaryOp::relu);
}
void gelu(const KernelCtx& c) {
  unary_op(c, tanh_approx(c) ? UnaryOp::gelu_tanh : UnaryOp::gelu);
}
void silu(const KernelCtx& c) {
  unary_op(c, UnaryOp::silu);
}
void tanh(const KernelCtx& c) {
  unary_op(c, UnaryOp::tanh);
}
void sigmoid(const KernelCtx& c) {
  unary_op(c, UnaryOp::sigmoid);
}
void fill_like(const KernelCtx& c) {
  unary(UnaryOp::fill, storage_of(c.out[0].dtype), nullptr, c.out[0].data, c.out[0].numel(),
        static_cast<float>(c.attrs().f("value")), stream_of(c));
}
void relu_grad(const KernelCtx& c) {
  grad_op(c, GradOp::relu);
}
void gelu_grad(const KernelCtx& c) {
  grad_op(c, tanh_approx(c) ? GradOp::gelu_tanh : GradOp::gelu);
}
void silu_grad(const KernelCtx& c) {
  grad_op(c, GradOp::silu);
}
void tanh_grad(const KernelCtx& c) {
  grad_op(c, GradOp::tanh);
}
void sigmoid_grad(const KernelCtx& c) {
  grad_op(c, GradOp::sigmoid);
}

void copy(const KernelCtx& c) {
  if (c.out[0].data == c.in[0].data) return;
  const size_t bytes = static_cast<size_t>(c.out[0].numel()) * dtype_size(c.out[0].dtype);
  check(cudaMemcpyAsync(c.out[0].data, c.in[0].data, bytes, cudaMemcpyDeviceToDevice, stream_of(c)),
        "cudaMemcpyAsync");
}

void cast(const KernelCtx& c) {
  const TensorView &x = c.in[0], &y = c.out[0];
  if (x.dtype == y.dtype) return copy(c);
  convert(storage_of(x.dtype), x.data, storage_of(y.dtype), y.data, x.numel(), stream_of(c));
}

}  // namespace flowrun::cuda
