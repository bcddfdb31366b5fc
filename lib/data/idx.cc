// Reader for gzipped IDX files (the MNIST / Fashion-MNIST array format: big-endian header, raw bytes).
#include <zlib.h>

#include <array>
#include <limits>

#include "data/dataset.h"

namespace flowrun {

namespace {

// An open gzip stream that closes itself; every short or failed read is an input_error naming the file.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path), f_(gzopen(path.c_str(), "rb")) {
    if (f_ == nullptr) throw input_error(cat(path, ": cannot open"));
  }
  ~GzReader() { gzclose(f_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to n bytes; returns how many were read (fewer only at the end of the data).
  size_t read_some(void* out, size_t n) {
    size_t done = 0;
    while (done < n) {
      const auto chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
      const int got = gzread(f_, static_cast<char*>(out) + done, chunk);
      if (got < 0) {
        int errnum = 0;
        throw input_error(cat(path_, ": corrupt gzip data (", gzerror(f_, &errnum), ")"));
      }
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  }
  void read_exact(void* out, size_t n, const std::string& what) {
    const size_t got = read_some(out, n);
    if (got != n)
      throw input_error(cat(path_, ": file ends inside the ", what, " (", got, " of ", n, " bytes)"));
  }
  bool at_end() {
    char c = 0;
    return read_some(&c, 1) == 0;
  }

 private:
  std::string path_;
  gzFile f_;
};

uint32_t big_endian(const std::array<unsigned char, 4>& b) {
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
}

}  // namespace

Tensor read_idx_gz(const std::string& path, int rank) {
  GzReader in(path);
  std::array<unsigned char, 4> word{};
  in.read_exact(word.data(), 4, "header");
  const uint32_t magic = big_endian(word);
  const uint32_t expected = 0x800u | static_cast<uint32_t>(rank);
  if (magic != expected)
    throw input_error(cat(path, ": not an IDX file of unsigned bytes with ", rank, " dimensions (magic 0x",
                          std::hex, magic, ", expected 0x", expected, ")"));
  Shape shape;
  int64_t count = 1;
  for (int d = 0; d < rank; ++d) {
    in.read_exact(word.data(), 4, "header");
    const int64_t dim = big_endian(word);
    if (dim == 0 || count > std::numeric_limits<int32_t>::max() / dim)
      throw input_error(cat(path, ": dimension ", d, " is ", dim, " (empty or too large)"));
    shape.push_back(dim);
    count *= dim;
  }
  Tensor t = Tensor::empty(shape, DType::u8);
  in.read_exact(t.raw(), static_cast<size_t>(count), cat("data of shape ", shape_str(shape)));
  if (!in.at_end()) throw input_error(cat(path, ": trailing bytes after the ", shape_str(shape), " array"));
  return t;
}

}  // namespace flowrun
