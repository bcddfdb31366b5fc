// The CUDA runtime calls, checked (see core/cuda/runtime.h).
#include "core/cuda/runtime.h"

#include <cuda_runtime_api.h>

#include "core/error.h"

namespace flowrun::cuda {

int device_count(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = cat(cudaGetErrorName(e), ": ", cudaGetErrorString(e));
    cudaGetLastError();  // clear it, so that later calls do not report it again
    return 0;
  }
  if (n == 0 && why) *why = "the CUDA runtime reports no device";
  return n;
}

void check(int status, const char* what) {
  const auto e = static_cast<cudaError_t>(status);
  if (e != cudaSuccess)
    throw runtime_error(cat("CUDA error in ", what, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
}

void* alloc(size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes == 0 ? 256 : bytes), "cudaMalloc");
  return p;
}

void free(void* p) {
  // Not checked: it runs in destructors, also while the process exits and the runtime unloads, where there
  // is nothing left to do about a failure.
  if (p) cudaFree(p);
}

void to_device(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (to the device)");
}

void to_host(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (to the host)");
}

void synchronize() {
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

}  // namespace flowrun::cuda
