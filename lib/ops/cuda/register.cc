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
  const std::pair<const char*, KernelFn> rows[] = {
      {"softmax", cuda::softmax},
      {"log_softmax", cuda::log_softmax},
      {"softmax_grad", cuda::softmax_grad},
      {"log_softmax_grad", cuda::log_softmax_grad},
      {"cross_entropy", cuda::cross_entropy},
      {"cross_entropy_grad", cuda::cross_entropy_grad},
      {"layernorm", cuda::layernorm},
      {"layernorm_grad", cuda::layernorm_grad},
      {"rmsnorm", cuda::rmsnorm},
      {"rmsnorm_grad", cuda::rmsnorm_grad},
      {"nll_loss", cuda::nll_loss},
      {"nll_loss_grad", cuda::nll_loss_grad},
  };
  for (const auto& [op, fn] : rows) r.add_kernel(op, {DeviceKind::cuda, floats, fn});
  const std::vector<DType> any = {DType::f32, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8};
  r.add_kernel("transpose", {DeviceKind::cuda, any, cuda::transpose});
  r.add_kernel("permute", {DeviceKind::cuda, any, cuda::permute});
  r.add_kernel("broadcast_to", {DeviceKind::cuda, floats, cuda::broadcast_to});
  r.add_kernel("slice", {DeviceKind::cuda, any, cuda::slice});
  r.add_kernel("slice_grad", {DeviceKind::cuda, any, cuda::slice_grad});
  r.add_kernel("concat", {DeviceKind::cuda, any, cuda::concat});
  r.add_kernel("split", {DeviceKind::cuda, any, cuda::split});
  r.add_kernel("reduce_sum", {DeviceKind::cuda, floats, cuda::reduce_sum});
  r.add_kernel("reduce_mean", {DeviceKind::cuda, floats, cuda::reduce_mean});
  r.add_kernel("reduce_max", {DeviceKind::cuda, floats, cuda::reduce_max});
  r.add_kernel("reduce_max_grad", {DeviceKind::cuda, floats, cuda::reduce_max_grad});
  r.add_kernel("mse_loss", {DeviceKind::cuda, floats, cuda::mse_loss});
  r.add_kernel("embedding", {DeviceKind::cuda, floats, cuda::embedding});
  r.add_kernel("embedding_grad", {DeviceKind::cuda, floats, cuda::embedding_grad});
  r.add_kernel("sdpa", {DeviceKind::cuda, floats, cuda::sdpa});
  r.add_kernel("sdpa_grad", {DeviceKind::cuda, floats, cuda::sdpa_grad});
  r.add_kernel("sdpa_cache", {DeviceKind::cuda, {DType::f32}, cuda::sdpa_cache});
  r.add_kernel("slice_at", {DeviceKind::cuda, any, cuda::slice_at});
  // The CPU's cos/sin table is not needed: a thread computes its pair's angle.
  r.add_kernel("rope", {DeviceKind::cuda, floats, cuda::rope, nullptr,
                        [](const std::vector<TensorType>&, const std::vector<TensorType>&, const Attrs&) {
                          return size_t{0};
                        }});
  r.add_kernel("dropout", {DeviceKind::cuda, floats, cuda::dropout});
  r.add_kernel("dropout_grad", {DeviceKind::cuda, floats, cuda::dropout_grad});
  // Scratch for the count's integer sum over the device's threads.
  const auto count_scratch = [](const std::vector<TensorType>&, const std::vector<TensorType>&,
                                const Attrs&) { return sizeof(unsigned long long); };
  r.add_kernel("mlm_mask", {DeviceKind::cuda, {DType::i64}, cuda::mlm_mask, nullptr, count_scratch});
  r.add_kernel("global_norm", {DeviceKind::cuda, floats, cuda::global_norm});
  r.add_kernel("clip_coef", {DeviceKind::cuda, {DType::f32}, cuda::clip_coef});
  r.add_kernel("grad_accumulate", {DeviceKind::cuda, {DType::f32}, cuda::grad_accumulate});
  r.add_kernel("unscale_coef", {DeviceKind::cuda, {DType::f32}, cuda::unscale_coef});
  r.add_kernel("loss_scale_update", {DeviceKind::cuda, {DType::f32}, cuda::loss_scale_update});
  r.add_kernel("sgd_update", {DeviceKind::cuda, {DType::f32}, cuda::sgd_update});
  r.add_kernel("adamw_update", {DeviceKind::cuda, {DType::f32}, cuda::adamw_update});
  r.add_kernel("sgd_update_multi", {DeviceKind::cuda, {DType::f32}, cuda::sgd_update_multi});
  r.add_kernel("adamw_update_multi", {DeviceKind::cuda, {DType::f32}, cuda::adamw_update_multi});
  r.add_kernel("matmul", {DeviceKind::cuda, floats, cuda::matmul});
  r.add_kernel("linear", {DeviceKind::cuda, floats, cuda::linear});
  const std::pair<const char*, KernelFn> collectives[] = {
      {"all_reduce", cuda::all_reduce},
      {"local_shard", cuda::local_shard},
      {"all_gather_into", cuda::all_gather_into},
      {"gather_shards", cuda::gather_shards},
      {"reduce_scatter_shard", cuda::reduce_scatter_shard},
      {"all_reduce_start", cuda::all_reduce_start},
      {"all_reduce_wait", cuda::all_reduce_wait},
      {"sbp_all_reduce", cuda::sbp_all_reduce},
      {"sbp_enter", cuda::sbp_copy},
      {"sbp_reduce_scatter", cuda::sbp_reduce_scatter},
  };
  for (const auto& [op, fn] : collectives) r.add_kernel(op, {DeviceKind::cuda, floats, fn});
  const std::vector<DType> gathered = {DType::f32, DType::f16, DType::bf16, DType::i64, DType::u8};
  r.add_kernel("sbp_all_gather", {DeviceKind::cuda, gathered, cuda::sbp_all_gather});
  r.add_kernel("sbp_slice", {DeviceKind::cuda, gathered, cuda::sbp_slice});
  // cuDNN's workspace, not the CPU kernels' im2col buffers.
  const std::pair<const char*, KernelFn> convs[] = {
      {"conv2d", cuda::conv2d},
      {"conv2d_grad_input", cuda::conv2d_grad_input},
      {"conv2d_grad_weight", cuda::conv2d_grad_weight},
  };
  for (const auto& [op, fn] : convs)
    r.add_kernel(op, {DeviceKind::cuda, floats, fn, nullptr, cuda::conv_workspace});
  r.add_kernel("maxpool2d", {DeviceKind::cuda, floats, cuda::maxpool2d});
  r.add_kernel("maxpool2d_grad", {DeviceKind::cuda, floats, cuda::maxpool2d_grad});
  r.add_kernel("avgpool2d", {DeviceKind::cuda, floats, cuda::avgpool2d});
  r.add_kernel("avgpool2d_grad", {DeviceKind::cuda, floats, cuda::avgpool2d_grad});
  r.add_kernel("global_avgpool", {DeviceKind::cuda, floats, cuda::global_avgpool});
  r.add_kernel("batchnorm", {DeviceKind::cuda, floats, cuda::batchnorm, nullptr, cuda::batchnorm_workspace});
  r.add_kernel("batchnorm_grad",
               {DeviceKind::cuda, floats, cuda::batchnorm_grad, nullptr, cuda::batchnorm_grad_workspace});
}

}  // namespace flowrun
