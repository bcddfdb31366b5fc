// Read-only file mappings (see mapped.h).
#include "data/mapped.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace flowrun {

namespace {

int64_t page_size() {
  static const int64_t p = sysconf(_SC_PAGESIZE);
  return p;
}

}  // namespace

MappedFile::MappedFile(const std::string& path, bool windowed) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw input_error(cat(path, ": cannot open: ", std::strerror(errno)));
  struct stat st {};
  if (fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string why = S_ISDIR(st.st_mode) ? "a directory" : "not a regular file";
    ::close(fd_);
    throw input_error(cat(path, ": cannot read as data: ", why));
  }
  size_ = st.st_size;
  if (size_ == 0 || windowed) return;
  void* p = mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_SHARED, fd_, 0);
  if (p != MAP_FAILED) {
    base_ = static_cast<const uint8_t*>(p);
    return;
  }
  const int err = errno;
  // Out of address space (RLIMIT_AS below the file's size): read through per-call windows instead.
  if (err == ENOMEM) {
    spdlog::info("{}: {} bytes do not fit the address space at once: mapping a window per read", path, size_);
    return;
  }
  ::close(fd_);
  throw input_error(cat(path, ": cannot map: ", std::strerror(err)));
}

MappedFile::~MappedFile() {
  if (base_ != nullptr) munmap(const_cast<uint8_t*>(base_), static_cast<size_t>(size_));
  if (fd_ >= 0) ::close(fd_);
}

void MappedFile::check_range(int64_t offset, int64_t len) const {
  FR_CHECK(offset >= 0 && len >= 0 && offset + len <= size_, path_, ": bytes [", offset, ", ", offset + len,
           ") of ", size_);
}

MappedFile::Window::Window(const MappedFile& file, int64_t offset, int64_t len) {
  // mmap's offset must be page-aligned: map from the page holding `offset`.
  const int64_t start = offset / page_size() * page_size();
  span = static_cast<size_t>(offset + len - start);
  map = mmap(nullptr, span, PROT_READ, MAP_SHARED, file.fd_, start);
  if (map == MAP_FAILED)
    throw runtime_error(
        cat(file.path_, ": cannot map bytes [", offset, ", ", offset + len, "): ", std::strerror(errno)));
  data = static_cast<const uint8_t*>(map) + (offset - start);
}

MappedFile::Window::~Window() {
  munmap(map, span);
}

}  // namespace flowrun
