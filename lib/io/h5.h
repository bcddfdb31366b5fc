// A thin RAII layer over the HDF5 C API (1.10): files, groups, tensor datasets and scalar/string
// attributes, with every HDF5 failure turned into a flowrun::Error that names the file and object.
// Used by checkpoints (lib/ckpt) and datasets (lib/data).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace flowrun::h5 {

class File {
 public:
  enum class Mode { read, create };  // create truncates
  File(const std::string& path, Mode mode);
  ~File();
  File(File&& o) noexcept;
  File& operator=(File&&) = delete;
  File(const File&) = delete;

  const std::string& path() const { return path_; }

  // Datasets by path ("params/block0/attn/w"); intermediate groups are created as needed.
  // Tensors of any flowrun dtype: f16/bf16 are stored as 16-bit HDF5 types (H5T_NATIVE_UINT16 with an
  // attribute "flowrun_dtype" = "f16"/"bf16"), all others as their native HDF5 type.
  void write(const std::string& path, const Tensor& t);
  // Raw bytes as a 1-d u8 dataset, chunked + deflate-compressed when `compress` (large text corpora).
  void write_bytes(const std::string& path, const uint8_t* data, size_t n, bool compress = false);
  // The full dataset as a CPU tensor of the stored dtype. Arrays from other tools: integers of other widths
  // widen to i32 (i8/u8.. i32, u16) or i64 (u32, u64); floats to f32 (<= 4 bytes) or f64.
  Tensor read(const std::string& path) const;
  // Reads elements [begin, begin+count) along dim 0 (hyperslab) into a tensor; for data loaders.
  Tensor read_rows(const std::string& path, int64_t begin, int64_t count) const;
  bool exists(const std::string& path) const;  // dataset or group
  Shape shape(const std::string& path) const;
  DType dtype(const std::string& path) const;
  // Every dataset below `group` ("" = root), as paths relative to the root, in sorted order.
  std::vector<std::string> datasets(const std::string& group = "") const;

  // Attributes on an object (dataset or group path; "" or "/" = the root group).
  // Setting an existing attribute replaces it. Strings are fixed-length UTF-8 (NUL-padded); reading accepts
  // variable-length strings (h5py's default) too.
  void set_attr(const std::string& obj, const std::string& name, const std::string& value);
  void set_attr(const std::string& obj, const std::string& name, int64_t value);
  void set_attr(const std::string& obj, const std::string& name, double value);
  void set_attr(const std::string& obj, const std::string& name, const std::vector<int64_t>& value);
  bool has_attr(const std::string& obj, const std::string& name) const;
  std::vector<std::string> attrs(const std::string& obj) const;  // attribute names on `obj`, sorted
  std::string attr_string(const std::string& obj, const std::string& name) const;
  int64_t attr_int(const std::string& obj, const std::string& name) const;
  double attr_double(const std::string& obj, const std::string& name) const;
  std::vector<int64_t> attr_ints(const std::string& obj, const std::string& name) const;

  void flush();  // H5Fflush(global)
  void close();  // idempotent; the destructor closes too

 private:
  std::string path_;
  int64_t id_ = -1;  // hid_t
};

// CRC-32C (Castagnoli) of a byte range, used for per-dataset checksums.
uint32_t crc32c(const void* data, size_t n, uint32_t seed = 0);

// Silences HDF5's own error stack printing (we report errors ourselves) for the calling thread, and turns off
// HDF5's exit hook; File's constructor calls it.
void quiet_hdf5_errors();

}  // namespace flowrun::h5
