// The background checkpoint writer: one thread, one job at a time (save_checkpoint's atomic write).
#include "train/ckpt_writer.h"

#include <chrono>
#include <utility>

namespace flowrun {

CheckpointWriter::CheckpointWriter(std::string dir, int64_t keep)
    : dir_(std::move(dir)), keep_(keep), thread_([this] { run(); }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !busy_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CheckpointWriter::run() {
  // HDF5's error stack is per thread: h5::File silences this thread's when it opens the file, and the
  // failure is reported once, by the exception wait() rethrows.
  for (;;) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return stop_ || job_.has_value(); });
    if (stop_ && !job_) return;
    CheckpointData job = std::move(*job_);
    job_.reset();
    lk.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    std::optional<Done> done;
    std::exception_ptr error;
    try {
      done = Done{save_checkpoint(dir_, job, keep_), job.step,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
    } catch (...) {
      error = std::current_exception();
    }
    lk.lock();
    done_ = std::move(done);
    error_ = error;
    busy_ = false;
    lk.unlock();
    cv_.notify_all();
  }
}

std::optional<CheckpointWriter::Done> CheckpointWriter::wait() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return !busy_; });
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
  std::optional<Done> d = std::move(done_);
  done_.reset();
  return d;
}

void CheckpointWriter::check() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!busy_ && error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

std::optional<CheckpointWriter::Done> CheckpointWriter::submit(CheckpointData snapshot) {
  std::optional<Done> previous = wait();
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = std::move(snapshot);
    busy_ = true;
  }
  cv_.notify_all();
  return previous;
}

}  // namespace flowrun
