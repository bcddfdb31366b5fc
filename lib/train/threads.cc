#include "train/threads.h"

#include <omp.h>

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace flowrun {

namespace {
constexpr int64_t kFirstGap = 8, kLongestGap = 128;
constexpr double kWinRatio = 0.9;  // a probe wins when it takes under 90% of the current median
}  // namespace

void ThreadAdapter::Recent::add(double s) {
  seconds[static_cast<size_t>(next)] = s;
  next = (next + 1) % kKeep;
  size = std::min(size + 1, kKeep);
}

double ThreadAdapter::Recent::median() const {
  // Insertion sort: GCC 12 warns (array-bounds) about std::sort's unrolled start on five elements.
  std::array<double, kKeep> v = seconds;
  for (int i = 1; i < size; ++i)
    for (int j = i; j > 0 && v[static_cast<size_t>(j)] < v[static_cast<size_t>(j - 1)]; --j)
      std::swap(v[static_cast<size_t>(j)], v[static_cast<size_t>(j - 1)]);
  return v[static_cast<size_t>(size / 2)];
}

ThreadAdapter::ThreadAdapter(int max, bool adapt)
    : max_(std::max(max, 1)),
      current_(max_),
      adapt_(adapt && max_ > 1),
      warm_(static_cast<size_t>(max_) + 1, false),
      recent_(static_cast<size_t>(max_) + 1) {}

int ThreadAdapter::probe_target() const {
  const bool down = current_ > 1, up = current_ < max_;
  if (down && up) return probe_down_ ? current_ - 1 : current_ + 1;
  return down ? current_ - 1 : current_ + 1;
}

int ThreadAdapter::begin_step() {
  probing_ = adapt_ && recent_[static_cast<size_t>(current_)].size >= 3 && until_probe_ <= 0;
  running_ = probing_ ? probe_target() : current_;
  omp_set_num_threads(running_);
  return running_;
}

void ThreadAdapter::end_step(double seconds) {
  ++steps_at_[running_];
  const size_t r = static_cast<size_t>(running_);
  if (!warm_[r]) {
    // Not compared (it built this count's primitives); a probe is tried again at once.
    warm_[r] = true;
    return;
  }
  recent_[r].add(seconds);
  if (!probing_) {
    --until_probe_;
    return;
  }
  const bool won = seconds < kWinRatio * recent_[static_cast<size_t>(current_)].median();
  if (!won) {
    wins_ = 0;
    gap_ = std::min(gap_ * 2, kLongestGap);
    until_probe_ = gap_;
    probe_down_ = !probe_down_;
    return;
  }
  wins_ = wins_target_ == running_ ? wins_ + 1 : 1;
  wins_target_ = running_;
  if (wins_ < 2) {
    until_probe_ = 0;  // confirm at once
    return;
  }
  current_ = running_;
  wins_ = 0;
  gap_ = kFirstGap;
  until_probe_ = gap_;
}

std::string ThreadAdapter::summary() const {
  const auto plural = [](int64_t n, const char* word) { return cat(n, " ", word, n == 1 ? "" : "s"); };
  if (!adapt_) return plural(max_, "thread");
  std::string s = cat("at most ", plural(max_, "thread"));
  const char* sep = " (adaptive: ";
  for (const auto& [count, steps] : steps_at_) {
    s += cat(sep, plural(steps, "step"), " at ", count);
    sep = ", ";
  }
  return s + (steps_at_.empty() ? " (adaptive)" : ")");
}

}  // namespace flowrun
