// The run directory's own files: the lock that keeps a second run out of it, and checked atomic rewrites
// of its text files (config.yaml, metrics.jsonl on resume).
#pragma once

#include <string>

namespace flowrun {

// Exclusive use of a run directory by one training run: an flock(2) on `<run dir>/flowrun.lock`, which the
// kernel releases when the process ends, however it ends (a crashed or SIGKILLed run leaves no stale lock).
// The holder's pid is written in the file for the message the next run gets.
class RunDirLock {
 public:
  // Takes the lock (creating the directory and the file as needed). Another process holding it is an
  // input_error naming the directory and that process's pid; a file that cannot be created or locked is a
  // runtime_error with the errno text.
  explicit RunDirLock(const std::string& run_dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

// Replaces `path` with `text`: written to `<path>.tmp.<pid>`, flushed to disk, renamed over `path`, the
// directory synced. Every step is checked; on a failure the temporary file is removed, `path` is left as
// it was, and the runtime_error names `path` and the errno text.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace flowrun
