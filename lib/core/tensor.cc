// Tensor storage and element conversions.
#include "core/tensor.h"

#include <cstring>

namespace flowrun {

Storage::Storage(size_t bytes, Device device)
    : data_(allocator_for(device).allocate(bytes)), bytes_(bytes), device_(device) {}
Storage::~Storage() { allocator_for(device_).deallocate(data_); }

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) FR_CHECK(d >= 0, "negative dimension in ", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(t.nbytes(), device);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  FR_CHECK(device.kind == DeviceKind::cpu, "zeros on ", device_str(device));
  std::memset(t.raw(), 0, t.nbytes());
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  FR_CHECK(flowrun::numel(shape) == numel(), "reshape ", shape_str(shape_), " -> ", shape_str(shape));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device());
  std::memcpy(t.raw(), raw(), nbytes());
  return t;
}

double load_as_f64(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(base)[i];
    case DType::f64: return static_cast<const double*>(base)[i];
    case DType::f16: return f16_to_float(static_cast<const f16*>(base)[i]);
    case DType::bf16: return bf16_to_float(static_cast<const bf16*>(base)[i]);
    case DType::i32: return static_cast<const int32_t*>(base)[i];
    case DType::i64: return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DType::u8: return static_cast<const uint8_t*>(base)[i];
  }
  return 0;
}

void store_from_f64(void* base, DType t, int64_t i, double v) {
  switch (t) {
    case DType::f32: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case DType::f64: static_cast<double*>(base)[i] = v; break;
    case DType::f16: static_cast<f16*>(base)[i] = float_to_f16(static_cast<float>(v)); break;
    case DType::bf16: static_cast<bf16*>(base)[i] = float_to_bf16(static_cast<float>(v)); break;
    case DType::i32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v); break;
    case DType::i64: static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v); break;
    case DType::u8: static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v); break;
  }
}

std::vector<double> Tensor::to_f64() const {
  std::vector<double> out(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) out[i] = load_as_f64(raw(), dtype_, i);
  return out;
}

Tensor Tensor::to(DType dtype) const {
  Tensor t = empty(shape_, dtype, device());
  for (int64_t i = 0; i < numel(); ++i) store_from_f64(t.raw(), dtype, i, load_as_f64(raw(), dtype_, i));
  return t;
}

void Tensor::fill_from(const std::vector<double>& values) {
  FR_CHECK(static_cast<int64_t>(values.size()) == numel(), "fill_from: ", values.size(), " values for ",
           shape_str(shape_));
  for (int64_t i = 0; i < numel(); ++i) store_from_f64(raw(), dtype_, i, values[i]);
}

}  // namespace flowrun
