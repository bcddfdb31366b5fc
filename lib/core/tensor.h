// Tensors: a shape and dtype over reference-counted device storage (always contiguous, row-major).
#pragma once

#include <memory>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"

namespace flowrun {

class Storage {
 public:
  Storage(size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_;
  size_t bytes_;
  Device device_;
};

template <typename T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<f16>() { return DType::f16; }
template <> constexpr DType dtype_of<bf16>() { return DType::bf16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::u8; }

class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(const Shape& shape, DType dtype, Device device = kCpu);
  static Tensor zeros(const Shape& shape, DType dtype, Device device = kCpu);
  template <typename T>
  static Tensor from(const Shape& shape, const std::vector<T>& values) {
    FR_CHECK(static_cast<int64_t>(values.size()) == flowrun::numel(shape), "value count does not match shape");
    Tensor t = empty(shape, dtype_of<T>());
    std::copy(values.begin(), values.end(), t.data<T>());
    return t;
  }

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : kCpu; }
  int64_t numel() const { return flowrun::numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  void* raw() const { return static_cast<char*>(storage_->data()) + offset_; }
  template <typename T>
  T* data() const {
    FR_CHECK(dtype_of<T>() == dtype_, "tensor is ", dtype_name(dtype_), ", accessed as ", dtype_name(dtype_of<T>()));
    return static_cast<T*>(raw());
  }
  // Same storage, new shape with the same element count.
  Tensor reshape(const Shape& shape) const;
  // Deep copy (same device).
  Tensor clone() const;
  // Values converted to double, for tests and reporting.
  std::vector<double> to_f64() const;
  // A new tensor of another dtype (rounding to nearest-even for f16/bf16).
  Tensor to(DType dtype) const;
  // Fill from doubles (converted to this tensor's dtype).
  void fill_from(const std::vector<double>& values);

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::f32;
};

// Element conversion between dtypes through double / float, used by casts, tests and checkpoints.
double load_as_f64(const void* base, DType t, int64_t i);
void store_from_f64(void* base, DType t, int64_t i, double v);

}  // namespace flowrun
