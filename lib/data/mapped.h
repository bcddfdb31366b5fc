// A read-only memory-mapped file: the text and token datasets read their samples through it, so that a file
// larger than RAM (its pages come and go with the page cache) trains without being read whole. A file larger
// than the process's address-space limit (`ulimit -v`) cannot be mapped at once: it is read with pread, one
// range per call, instead (which leaves the address space alone, where a window mapped per call would mmap
// and munmap for every sample).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace flowrun {

class MappedFile {
 public:
  // Opens and maps `path` (a regular file; an empty one maps nothing) when the address space allows; else
  // (mmap's ENOMEM under RLIMIT_AS, or `unmapped`, which tests use to reach that path) reads per call.
  // Every failure (missing, unreadable, a directory) is an input_error naming the file.
  explicit MappedFile(const std::string& path, bool unmapped = false);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }
  bool whole() const { return base_ != nullptr || size_ == 0; }

  // Calls f with the bytes [offset, offset + len) (which must lie inside the file): in the mapping, or when
  // unmapped in this thread's read buffer (so f must not call with_range itself). Safe from several threads
  // at once. (A template: the loader calls it per sample, and it must not allocate once the buffer has
  // grown.)
  template <typename F>
  void with_range(int64_t offset, int64_t len, F&& f) const {
    check_range(offset, len);
    if (whole()) {
      f(base_ == nullptr ? nullptr : base_ + offset);
      return;
    }
    f(read_range(offset, len));
  }

 private:
  // Reads [offset, offset + len) into this thread's buffer (grown as needed) and returns it.
  const uint8_t* read_range(int64_t offset, int64_t len) const;
  void check_range(int64_t offset, int64_t len) const;

  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
  const uint8_t* base_ = nullptr;  // the whole file, or null when unmapped
};

}  // namespace flowrun
