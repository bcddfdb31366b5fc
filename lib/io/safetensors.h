// Safetensors files (the weight format of the Hugging Face ecosystem): an 8-byte little-endian header length
// N, a JSON header of N bytes {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"<key>": "<string>"}}, then the tensors' bytes (little-endian, row-major), offsets counted
// from the end of the header. Read and written with nlohmann-json; everything is validated: a damaged or
// truncated file is an input_error naming the file, the tensor and the byte offset.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/tensor.h"

namespace flowrun::safetensors {

// One tensor's entry in the header. `dtype` is the file's name for it ("F32", "BF16", ...).
struct Entry {
  std::string dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;  // data_offsets, relative to the first byte after the header
};

struct Header {
  std::map<std::string, Entry> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__"
  uint64_t data_start = 0;                      // 8 + header length: where the data begins in the file
};

// Parses and validates a header: `json` is the N header bytes, `data_bytes` the size of what follows them.
// Checks the JSON, every entry's keys and types, a known dtype, shape x dtype size = end - begin, offsets
// inside the data, no overlap and no gap (the tensors tile the data exactly, as the reference
// implementation requires), names unique. Errors name `path` and the tensor (and, for JSON, the byte).
Header parse_header(const std::string& json, uint64_t data_bytes, const std::string& path);

// Reads only the header of a file (8-byte length, JSON), validated against the file's size.
Header read_header(const std::string& path);

// The whole file: metadata and every tensor. Dtypes flowrun has (F32, F64, F16, BF16, I32, I64, U8) come
// back as they are stored; the others flowrun does not compute in (BOOL, I8, I16, U16, U32, U64, F8_*) are
// an input_error naming the tensor. `metadata`, when given, receives "__metadata__".
std::map<std::string, Tensor> read(const std::string& path,
                                   std::map<std::string, std::string>* metadata = nullptr);

// Writes `tensors` (CPU tensors of any flowrun dtype) in name order, the header padded with spaces to a
// multiple of 8 bytes so that every tensor's data is 8-byte aligned (as the Python package does). Every
// write is checked; the caller makes it atomic (replace_file_atomically).
void write(const std::string& path, const std::map<std::string, Tensor>& tensors,
           const std::map<std::string, std::string>& metadata = {});

// The safetensors dtype name of a flowrun dtype ("F32", ...), and back (nullopt: not one flowrun has).
const char* format_dtype(DType t);
std::optional<DType> parse_format_dtype(const std::string& name);

}  // namespace flowrun::safetensors
