// Element types: the seven dtypes flowrun stores, their sizes and names, and exact f16/bf16 conversions.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace flowrun {

enum class DType : uint8_t { f32, f64, f16, bf16, i32, i64, u8 };

inline constexpr DType kAllDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                       DType::i32, DType::i64, DType::u8};

size_t dtype_size(DType t);
const char* dtype_name(DType t);
std::optional<DType> parse_dtype(std::string_view name);
bool is_floating(DType t);

// IEEE binary16 and bfloat16 are storage types: compute converts to f32 and rounds back to nearest-even.
struct f16 {
  uint16_t bits = 0;
};
struct bf16 {
  uint16_t bits = 0;
};

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 float_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return bf16{static_cast<uint16_t>(u >> 16)};
}
inline float bf16_to_float(bf16 h) { return bits_f32(static_cast<uint32_t>(h.bits) << 16); }

f16 float_to_f16(float f);
float f16_to_float(f16 h);

}  // namespace flowrun
