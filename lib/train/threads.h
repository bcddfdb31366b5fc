// The CPU thread count of a run's steps, adapted to how busy the machine is (train.adapt_threads).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace flowrun {

// The cores this process may run on: its CPU affinity mask (taskset, Slurm's cpuset), else every online one.
int usable_cores();

// With another busy process on the machine, an OpenMP team of every core waits at each barrier for a thread
// the kernel has descheduled: a 2-thread step took 1.6x the 1-thread one here. ThreadAdapter runs most
// steps at its current count and, now and then, a probe at a neighbouring count (one fewer or one more, up
// to the configured maximum): four steps, cut short as soon as they are slower than the current count's
// last 16. When the four beat those by 10%, by their mean (the throughput; the current count's slowest
// step left out) or by their median, their count becomes current. The first probe comes after three timed
// steps; a losing one doubles the gap to the next (8 steps up to 128), so an idle machine pays for about one
// slow step in a hundred. The first step at any count is not compared: it builds that count's oneDNN
// primitives. Changing the count changes no result: every CPU kernel gives the same bits for any thread count
// (the convolution weight gradients and the long-K matmuls cut their sums into fixed blocks for this), tested
// by cli.threads. Each process adapts by its own steps.
class ThreadAdapter {
 public:
  // `max`: the count configured (train.threads, or the OpenMP default); `adapt`: false keeps it fixed.
  ThreadAdapter(int max, bool adapt);

  // Sets the OpenMP thread count for the next step and returns it.
  int begin_step();
  // The wall time of the step begun last.
  void end_step(double seconds);

  int current() const { return current_; }
  int last() const { return running_; }  // the count of the step begun last
  int max() const { return max_; }
  bool adapts() const { return adapt_; }
  // Steps run at each count so far.
  const std::map<int, int64_t>& steps_at() const { return steps_at_; }
  // "2 threads", or with adaptation "at most 2 threads (adaptive: 95 steps at 1, 5 steps at 2)".
  std::string summary() const;

 private:
  static constexpr int kKeep = 16;  // the current count's steps kept: two of a busy CNN's 1-in-8 long ones
  struct Recent {
    std::array<double, kKeep> seconds{};
    int size = 0, next = 0;
    void add(double s);
    double typical() const;  // the mean without the slowest
    double mean() const;
    double median() const;
  };

  int probe_target() const;

  int max_, current_;
  bool adapt_;
  int running_ = 0;                 // the count of the step in progress
  bool probing_ = false;            // the step in progress is a probe
  int64_t until_probe_ = 3;         // timed steps at the current count before the next probe
  int64_t gap_ = 8;                 // the current gap between probes
  bool probe_down_ = true;          // which neighbour the next probe tries, when both exist
  std::vector<bool> warm_;          // a step at this count has run (index: count)
  Recent recent_;                   // the current count's steps
  Recent probe_;                    // the probe in progress
  std::map<int, int64_t> steps_at_;
};

}  // namespace flowrun
