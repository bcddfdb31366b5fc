// libflowrun_cuda.so's entry point (see core/cuda_backend.h): the CUDA kernels join the op registry, and the
// runtime and NCCL calls are handed to the rest of flowrun.
#include "core/cuda/runtime.h"
#include "core/cuda_backend.h"
#include "ops/all_ops.h"
#include "ops/registry.h"
#include "parallel/cuda/nccl.h"

extern "C" __attribute__((visibility("default"))) const flowrun::cuda::Backend* flowrun_cuda_backend() {
  using namespace flowrun;
  register_cuda_kernels(OpRegistry::get());
  static const cuda::Backend backend{
      &cuda::device_count,
      &cuda::alloc,
      &cuda::free,
      &cuda::to_device,
      &cuda::to_host,
      &cuda::synchronize,
      &cuda::stream_create,
      &cuda::stream_destroy,
      &cuda::capture_begin,
      &cuda::capture_end,
      &cuda::graph_launch,
      &cuda::graph_destroy,
      &select_gpu,
      [](Communicator& host) -> std::shared_ptr<Communicator> { return make_nccl_communicator(host); },
  };
  return &backend;
}
