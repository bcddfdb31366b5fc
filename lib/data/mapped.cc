// Read-only file mappings (see mapped.h).
#include "data/mapped.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace flowrun {

MappedFile::MappedFile(const std::string& path, bool unmapped) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw input_error(cat(path, ": cannot open: ", std::strerror(errno)));
  struct stat st {};
  if (fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    const std::string why = S_ISDIR(st.st_mode) ? "a directory" : "not a regular file";
    ::close(fd_);
    throw input_error(cat(path, ": cannot read as data: ", why));
  }
  size_ = st.st_size;
  if (size_ == 0 || unmapped) return;
  void* p = mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_SHARED, fd_, 0);
  if (p != MAP_FAILED) {
    base_ = static_cast<const uint8_t*>(p);
    return;
  }
  const int err = errno;
  // Out of address space (RLIMIT_AS below the file's size): read per call instead.
  if (err == ENOMEM) {
    spdlog::info("{}: its {} bytes do not fit this process's address space: reading samples with pread", path,
                 size_);
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

const uint8_t* MappedFile::read_range(int64_t offset, int64_t len) const {
  thread_local std::vector<uint8_t> buffer;
  if (buffer.size() < static_cast<size_t>(len)) buffer.resize(static_cast<size_t>(len));
  for (int64_t done = 0; done < len;) {
    const ssize_t got = pread(fd_, buffer.data() + done, static_cast<size_t>(len - done), offset + done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0)
      throw runtime_error(
          cat(path_, ": cannot read bytes [", offset, ", ", offset + len, "): ", std::strerror(errno)));
    if (got == 0)
      throw input_error(cat(path_, ": ends at byte ", offset + done, ", but it had ", size_,
                            " bytes when opened (was it truncated while training?)"));
    done += got;
  }
  return buffer.data();
}

}  // namespace flowrun
