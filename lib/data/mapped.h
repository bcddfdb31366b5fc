// A read-only memory-mapped file: the text and token datasets read their samples through it, so that a file
// larger than RAM (its pages come and go with the page cache) or than the process's address-space limit
// (`ulimit -v`: then it is mapped one window per read) trains without being read whole.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace flowrun {

class MappedFile {
 public:
  // Opens and maps `path` (a regular file; an empty one maps nothing). Whole when the address space allows;
  // else (mmap's ENOMEM under RLIMIT_AS, or `windowed`, which tests use to reach that path) windows per read.
  // Every failure (missing, unreadable, a directory) is an input_error naming the file.
  explicit MappedFile(const std::string& path, bool windowed = false);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }
  bool whole() const { return base_ != nullptr || size_ == 0; }

  // Calls f with the bytes [offset, offset + len) (which must lie inside the file), mapped for the call
  // only when the file is windowed. Safe from several threads at once (a window is private to its call).
  // (A template: the loader calls it per sample, and it must not allocate.)
  template <typename F>
  void with_range(int64_t offset, int64_t len, F&& f) const {
    check_range(offset, len);
    if (whole() || len == 0) {  // (an empty range maps nothing: mmap refuses length 0)
      f(base_ == nullptr ? nullptr : base_ + offset);
      return;
    }
    const Window w(*this, offset, len);
    f(w.data);
  }

 private:
  // A mapping of the pages holding [offset, offset + len), unmapped when it goes out of scope.
  struct Window {
    Window(const MappedFile& file, int64_t offset, int64_t len);
    ~Window();
    Window(const Window&) = delete;
    Window& operator=(const Window&) = delete;
    void* map = nullptr;
    size_t span = 0;
    const uint8_t* data = nullptr;
  };
  void check_range(int64_t offset, int64_t len) const;

  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
  const uint8_t* base_ = nullptr;  // the whole file, or null when windowed
};

}  // namespace flowrun
