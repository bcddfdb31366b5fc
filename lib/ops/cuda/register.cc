// The CUDA kernels, added to the ops the CPU registered (one KernelDef per op, for the dtypes it stores).
#include "ops/all_ops.h"
#include "ops/cuda/kernels.h"

namespace flowrun {

void register_cuda_kernels(OpRegistry& r) {
  const std::vector<DType> floats = {DType::f32, DType::f16, DType::bf16};
  const std::pair<const char*, KernelFn> elementwise[] = {
      {"add", cuda::add},
      {"sub", cuda::sub},
      {"mul", cuda::mul},
      {"div", cuda::div},
      {"add_scalar", cuda::add_scalar},
      {"mul_scalar", cuda::mul_scalar},
      {"pow_scalar", cuda::pow_scalar},
      {"relu", cuda::relu},
      {"gelu", cuda::gelu},
      {"silu", cuda::silu},
      {"tanh", cuda::tanh},
      {"sigmoid", cuda::sigmoid},
      {"relu_grad", cuda::relu_grad},
      {"gelu_grad", cuda::gelu_grad},
      {"silu_grad", cuda::silu_grad},
      {"tanh_grad", cuda::tanh_grad},
      {"sigmoid_grad", cuda::sigmoid_grad},
      {"fill_like", cuda::fill_like},
      {"stop_gradient", cuda::copy},
      {"reshape", cuda::copy},
      {"cast", cuda::cast},
  };
  for (const auto& [op, fn] : elementwise) r.add_kernel(op, {DeviceKind::cuda, floats, fn});
}

}  // namespace flowrun
