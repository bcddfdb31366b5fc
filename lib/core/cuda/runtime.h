// The CUDA runtime as flowrun uses it (built with FLOWRUN_CUDA only): device discovery that answers without
// a GPU or driver, checked calls that throw an Error naming the call, device memory and copies.
#pragma once

#include <cstddef>
#include <string>

namespace flowrun::cuda {

// The devices this process sees; 0, with the runtime's reason in `why`, when there are none (no driver, no
// GPU, CUDA_VISIBLE_DEVICES empty). cudaGetDeviceCount fails without a GPU and leaves its count unwritten.
int device_count(std::string* why);

// Throws an Error "CUDA error in <what>: <the runtime's message>" unless `status` (a cudaError_t) is success.
void check(int status, const char* what);

void* alloc(size_t bytes);  // device memory (256-byte aligned)
void free(void* p);         // never throws
void to_device(void* dst, const void* src, size_t bytes);
void to_host(void* dst, const void* src, size_t bytes);
void synchronize();

// A stream of the executor's own: CUDA graphs are captured from a stream other than the legacy default one.
// It is a blocking stream, so that copies on the default stream (to_device, to_host) stay ordered with it.
void* stream_create();
void stream_destroy(void* stream);  // never throws

// CUDA graphs. Between capture_begin and capture_end, work launched on `stream` from this thread is recorded,
// not run; capture_end returns the instantiated graph, or null (with `why` set) when the capture failed,
// e.g. because a kernel called something that cannot be captured; the failed capture is cleaned up.
void capture_begin(void* stream);
void* capture_end(void* stream, std::string* why);
void graph_launch(void* graph, void* stream);
void graph_destroy(void* graph);  // never throws

}  // namespace flowrun::cuda
