// The CPU allocator (64-byte aligned) and device naming.
#include "core/device.h"

#include <cstdlib>
#include <new>

#include "core/cuda_backend.h"
#include "core/error.h"

namespace flowrun {

const char* device_kind_name(DeviceKind k) {
  return k == DeviceKind::cpu ? "cpu" : "cuda";
}

std::string device_str(Device d) {
  return d.kind == DeviceKind::cpu ? std::string("cpu") : cat("cuda:", d.index);
}

namespace {
class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override {
    const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void deallocate(void* p) override { std::free(p); }
};

// The current CUDA device's memory (cudaMalloc: 256-byte aligned). One device per process.
class CudaAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes) override { return cuda::backend().alloc(bytes); }
  void deallocate(void* p) override { cuda::backend().free(p); }
};
}  // namespace

Allocator& allocator_for(Device d) {
  static CpuAllocator cpu;
  if (d.kind == DeviceKind::cpu) return cpu;
  static CudaAllocator gpu;
  if (d.index == 0) {
    cuda::backend();  // refused here, naming why, when the backend cannot be opened
    return gpu;
  }
  throw input_error(cat("device ", device_str(d), " is not available in this build of flowrun"));
}

}  // namespace flowrun
