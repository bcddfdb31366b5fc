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

}  // namespace flowrun
