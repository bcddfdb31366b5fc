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

void* stream_create() {
  cudaStream_t s = nullptr;
  check(cudaStreamCreate(&s), "cudaStreamCreate");
  return s;
}

void stream_destroy(void* stream) {
  if (stream) cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

void capture_begin(void* stream) {
  // Thread-local: the data loader's thread may use the runtime meanwhile without breaking the capture.
  check(cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeThreadLocal),
        "cudaStreamBeginCapture");
}

void* capture_end(void* stream, std::string* why) {
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph);
  cudaGraphExec_t exec = nullptr;
  if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
  if (graph) cudaGraphDestroy(graph);  // the executable graph is independent of it
  if (e != cudaSuccess) {
    if (why) *why = cat(cudaGetErrorName(e), ": ", cudaGetErrorString(e));
    cudaGetLastError();  // a failed capture leaves its error behind: clear it for the uncaptured run
    return nullptr;
  }
  return exec;
}

void graph_launch(void* graph, void* stream) {
  check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), static_cast<cudaStream_t>(stream)),
        "cudaGraphLaunch");
}

void graph_destroy(void* graph) {
  if (graph) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
}

}  // namespace flowrun::cuda
