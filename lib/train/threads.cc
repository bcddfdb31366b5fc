#include "train/threads.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace flowrun {

namespace {
constexpr int64_t kFirstGap = 8, kLongestGap = 128;
constexpr int kProbeSteps = 4;     // steps in a probe that wins
constexpr double kWinRatio = 0.9;  // a probe wins when it takes under 90% of the current count's typical step
}  // namespace

int usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

void ThreadAdapter::Recent::add(double s) {
  seconds[static_cast<size_t>(next)] = s;
  next = (next + 1) % kKeep;
  size = std::min(size + 1, kKeep);
}

double ThreadAdapter::Recent::typical() const {
  // The mean, not the median: a busy neighbour costs a 2-thread CNN step little most of the time and 6x
  // once in eight steps, so the median hides a team that is 1.7-2x slower on average. Leaving out the
  // slowest step keeps one stray hiccup of an idle machine from moving the run.
  if (size < 2) return mean();
  const double slowest = *std::max_element(seconds.begin(), seconds.begin() + size);
  return (mean() * size - slowest) / (size - 1);
}

double ThreadAdapter::Recent::median() const {
  // Insertion sort: GCC 12 warns (array-bounds) about std::sort's unrolled start on small arrays.
  std::array<double, kKeep> v = seconds;
  for (int i = 1; i < size; ++i)
    for (int j = i; j > 0 && v[static_cast<size_t>(j)] < v[static_cast<size_t>(j - 1)]; --j)
      std::swap(v[static_cast<size_t>(j)], v[static_cast<size_t>(j - 1)]);
  return v[static_cast<size_t>(size / 2)];
}

double ThreadAdapter::Recent::mean() const {
  double sum = 0;
  for (int i = 0; i < size; ++i) sum += seconds[static_cast<size_t>(i)];
  return sum / size;
}

ThreadAdapter::ThreadAdapter(int max, bool adapt)
    : max_(std::max(max, 1)),
      current_(max_),
      adapt_(adapt && max_ > 1),
      warm_(static_cast<size_t>(max_) + 1, false) {}

int ThreadAdapter::probe_target() const {
  const bool down = current_ > 1, up = current_ < max_;
  if (down && up) return probe_down_ ? current_ - 1 : current_ + 1;
  return down ? current_ - 1 : current_ + 1;
}

int ThreadAdapter::begin_step() {
  probing_ = adapt_ && recent_.size >= 3 && until_probe_ <= 0;
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
  if (!probing_) {
    recent_.add(seconds);
    --until_probe_;
    return;
  }
  probe_.add(seconds);
  // A count wins on kProbeSteps probe steps, so that one whose steps are fast only now and then does not
  // win on a lucky step or two; until then a probe goes on while it is no slower than the current count
  // (the first step at a new count runs 25-50% slow: its data still sits in the other core's cache).
  // It wins by its mean (the throughput: a busy neighbour makes one 2-thread CNN step in eight 6x slower
  // and the rest hardly, so the median misses it) or by its median (a busy MLP's 2-thread steps alternate
  // 2.3 and 6.3 ms: the mean is 1 thread's, but most steps are 1.5x slower).
  const bool last = probe_.size == kProbeSteps;
  const double margin = last ? kWinRatio : 1.0;
  const bool won = probe_.mean() < margin * recent_.typical() || probe_.median() < margin * recent_.median();
  if (won && !last) {
    until_probe_ = 0;
    return;
  }
  if (won) {
    current_ = running_;
    recent_ = probe_;
    gap_ = kFirstGap;
  } else {
    gap_ = std::min(gap_ * 2, kLongestGap);
    probe_down_ = !probe_down_;
  }
  probe_ = Recent{};
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
