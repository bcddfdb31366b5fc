// Devices and their allocators. Callers name a Device; the CUDA backend adds its own allocator behind the
// same interface without changing them.
#pragma once

#include <cstddef>
#include <string>

namespace flowrun {

enum class DeviceKind : uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  bool operator==(const Device&) const = default;
};

inline constexpr Device kCpu{};
const char* device_kind_name(DeviceKind k);
std::string device_str(Device d);

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p) = 0;
};

// The allocator of a device; throws a clear error for a device this build or machine does not have.
Allocator& allocator_for(Device d);

// Buffers are aligned for AVX-512 loads and cache lines; CPU buffers of kHugeFrom bytes and more to
// kHugePage, and marked for transparent huge pages (device.cc says why).
inline constexpr size_t kAlignment = 64;
inline constexpr size_t kHugePage = size_t{2} << 20, kHugeFrom = size_t{8} << 20;

// Whether this machine gives transparent huge pages to the regions the CPU allocator marks (the kernel's
// THP mode is `always` or `madvise`).
bool transparent_huge_pages();
// The bytes a CPU buffer of `bytes` holds resident once every byte of it has been touched: from kHugeFrom on,
// where `thp`, whole kHugePage pages, so up to 2 MiB more (gpt-tiny's 140.51 MiB arena: 142 MiB of
// AnonHugePages in /proc/PID/smaps).
size_t resident_bytes(size_t bytes, bool thp = transparent_huge_pages());

}  // namespace flowrun
