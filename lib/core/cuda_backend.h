// The CUDA backend, opened at run time: the CUDA runtime, cuBLASLt, cuDNN, NCCL and flowrun's kernels live
// in libflowrun_cuda.so (core/cuda/, ops/cuda/, parallel/cuda/), which this process maps only when a run
// asks for a GPU. A CPU run maps none of CUDA's libraries, and the same binary starts where they are absent.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace flowrun {

class Communicator;

namespace cuda {

// What the backend library offers the rest of flowrun (libflowrun_cuda.so's flowrun_cuda_backend() fills
// it; core/cuda/runtime.h and parallel/cuda/nccl.h say what each call does).
struct Backend {
  int (*device_count)(std::string* why);
  void* (*alloc)(size_t bytes);
  void (*free)(void* p);
  void (*to_device)(void* dst, const void* src, size_t bytes);
  void (*to_host)(void* dst, const void* src, size_t bytes);
  void (*synchronize)();
  void* (*stream_create)();
  void (*stream_destroy)(void* stream);
  void (*capture_begin)(void* stream);
  void* (*capture_end)(void* stream, std::string* why);
  void (*graph_launch)(void* graph, void* stream);
  void (*graph_destroy)(void* graph);
  int (*select_gpu)(int local_rank);
  std::shared_ptr<Communicator> (*make_nccl_communicator)(Communicator& host);
};

// Opens the backend on first use (its kernels join the op registry then) and returns it; null, with the
// reason in `why`, when it cannot be opened: a build without CUDA, or CUDA's libraries missing. The library
// is looked for in $FLOWRUN_CUDA_BACKEND (a path), beside libflowrun_core.so, then in the build tree.
const Backend* load_backend(std::string* why);
// The backend, opened; an input_error naming the reason when it cannot be.
const Backend& backend();

}  // namespace cuda
}  // namespace flowrun
