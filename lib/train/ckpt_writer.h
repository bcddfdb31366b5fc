// Checkpoints written by a background thread, so that the step loop waits only for a snapshot of the
// weights and state. At most one write is in flight: submit() first waits for the previous one.
#pragma once

#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "ckpt/checkpoint.h"

namespace flowrun {

class CheckpointWriter {
 public:
  struct Done {
    std::string path;
    int64_t step = 0;
    double seconds = 0;  // the write itself, in the background
  };

  CheckpointWriter(std::string dir, int64_t keep);
  ~CheckpointWriter();  // waits for the write in flight (errors are dropped: call wait() to see them)
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Waits for the previous write (rethrowing its error), then hands `snapshot` to the writer thread. The
  // previous write's result, if one completed, is returned.
  std::optional<Done> submit(CheckpointData snapshot);
  // Waits for the write in flight; its result (or nothing if none was pending). Rethrows its error.
  std::optional<Done> wait();
  // Without waiting: rethrows the error of a write that has failed, if one has.
  void check();

 private:
  void run();
  std::string dir_;
  int64_t keep_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<CheckpointData> job_;
  std::optional<Done> done_;
  std::exception_ptr error_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace flowrun
