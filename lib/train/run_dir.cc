// The run directory's lock file and checked atomic rewrites of its text files.
#include "train/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "core/error.h"

namespace flowrun {
namespace fs = std::filesystem;

namespace {

// The pid the holder wrote, or "" when unreadable. The holder writes it just after taking the lock, so a
// contender that looks in between sees an empty file: it looks again, briefly.
std::string holder_pid(const std::string& path) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "";
    char buf[32] = {};
    const ssize_t n = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    std::string pid(buf, n > 0 ? static_cast<size_t>(n) : 0);
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    if (!pid.empty()) return pid;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return "";
}

// Writes all of `text` to `fd`, retrying short writes and EINTR; false with errno set on a failure.
bool write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

RunDirLock::RunDirLock(const std::string& run_dir) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) throw runtime_error(cat("cannot create the run directory ", run_dir, ": ", ec.message()));
  const std::string path = (fs::path(run_dir) / "flowrun.lock").string();
  // No O_TRUNC: the file may be another process's, holding its pid.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw runtime_error(cat("cannot open the lock file ", path, ": ", std::strerror(errno)));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK)
      throw runtime_error(
          cat("cannot lock the run directory ", run_dir, " (", path, "): ", std::strerror(err)));
    const std::string pid = holder_pid(path);
    throw input_error(cat("the run directory ", run_dir, " is in use by another flowrun train (pid ",
                          pid.empty() ? std::string("unknown") : pid, ", lock file ", path,
                          "): wait for it to end, or give this run another --run-dir"));
  }
  const std::string pid = cat(::getpid(), "\n");
  // The pid only serves the message above: a failure to record it does not stop the run.
  if (::ftruncate(fd_, 0) == 0) write_all(fd_, pid);
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = cat(path, ".tmp.", ::getpid());
  auto fail = [&](const char* what, int err, int fd) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw runtime_error(cat("cannot write ", path, " (", what, " ", tmp, "): ", std::strerror(err), "; ",
                            path, " is unchanged"));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("creating", errno, -1);
  if (!write_all(fd, text)) fail("writing", errno, fd);
  if (::fsync(fd) != 0) fail("syncing", errno, fd);
  if (::close(fd) != 0) fail("closing", errno, -1);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("renaming", errno, -1);
  // The rename reaches the disk with the directory.
  const std::string dir = fs::path(path).parent_path().empty() ? "." : fs::path(path).parent_path().string();
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0 || ::fsync(dfd) != 0) {
    const int err = errno;
    if (dfd >= 0) ::close(dfd);
    throw runtime_error(
        cat("cannot sync the directory ", dir, " after writing ", path, ": ", std::strerror(err)));
  }
  ::close(dfd);
}

}  // namespace flowrun
