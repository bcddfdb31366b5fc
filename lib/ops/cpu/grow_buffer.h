// A 64-byte aligned buffer that only grows: the oneDNN kernels' shared scratchpads and reorder targets, which
// reach their largest size in the first step and then allocate nothing.
#pragma once

#include <cstddef>
#include <memory>
#include <new>

namespace flowrun::cpu {

class GrowBuffer {
 public:
  size_t size() const { return size_; }
  void* data() const { return data_.get(); }  // what the last reserve returned
  void* reserve(size_t bytes) {
    if (bytes > size_) {
      data_.reset(::operator new (bytes, std::align_val_t{64}));
      size_ = bytes;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(void* p) const { ::operator delete (p, std::align_val_t{64}); }
  };
  std::unique_ptr<void, Free> data_;
  size_t size_ = 0;
};

// The calling thread's scratch of at least `bytes`, 64-byte aligned, grown to its largest request and then
// reused (one per thread, shared by the kernels that call it one at a time): sdpa_qkv_grad's per-head
// scratch. Its size is reported through those kernels' KernelDef::host_buffers.
inline void* thread_scratch(size_t bytes) {
  static thread_local GrowBuffer buf;
  return buf.reserve(bytes);
}

}  // namespace flowrun::cpu
