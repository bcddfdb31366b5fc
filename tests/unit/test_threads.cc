// ThreadAdapter (train.adapt_threads) driven by synthetic step times: which count it runs each step at.
#include <gtest/gtest.h>
#include <omp.h>

#include <functional>
#include <vector>

#include "config/config.h"
#include "train/program.h"
#include "train/threads.h"

namespace flowrun::testing {
namespace {

// Runs `steps` steps whose time is seconds(count, step); returns the count of each step. Restores the
// OpenMP thread count (begin_step sets it).
std::vector<int> drive(ThreadAdapter& a, int steps, const std::function<double(int, int)>& seconds) {
  const int saved = omp_get_max_threads();
  std::vector<int> counts;
  for (int i = 0; i < steps; ++i) {
    const int n = a.begin_step();
    EXPECT_EQ(omp_get_max_threads(), n);
    counts.push_back(n);
    a.end_step(seconds(n, i));
  }
  omp_set_num_threads(saved);
  return counts;
}

int count_of(const std::vector<int>& v, int n, size_t from = 0) {
  int c = 0;
  for (size_t i = from; i < v.size(); ++i) c += v[i] == n;
  return c;
}

// An idle 2-core machine: 2 threads are faster. Nearly every step runs at 2; the losing probes at 1 grow
// further apart (8, 16, 32, ... up to 128 steps).
TEST(ThreadAdapter, IdleMachineStaysAtMaxAndProbesRarely) {
  ThreadAdapter a(2, true);
  const auto counts = drive(a, 1000, [](int n, int) { return n == 2 ? 0.10 : 0.18; });
  EXPECT_EQ(a.current(), 2);
  EXPECT_EQ(counts.front(), 2);
  EXPECT_GE(count_of(counts, 1), 3);
  EXPECT_LE(count_of(counts, 1), 14);
  EXPECT_LE(count_of(counts, 1, 500), 5);  // the gap has reached 128
}

// Another busy process: 2 threads take 1.6x as long as 1. After a few probes the run settles at 1 thread
// and stays; a probe at 2 now and then checks whether the machine is free again.
TEST(ThreadAdapter, BusyMachineMovesToFewerThreads) {
  ThreadAdapter a(2, true);
  const auto counts = drive(a, 400, [](int n, int) { return n == 2 ? 0.49 : 0.31; });
  EXPECT_EQ(a.current(), 1);
  size_t settled = 0;
  while (settled < counts.size() && counts[settled] == 2) ++settled;
  EXPECT_LE(settled, 5u);  // the first step and three timed ones at 2, and the probe's warm-up
  EXPECT_GE(count_of(counts, 1), 380);
  EXPECT_EQ(a.summary().rfind("at most 2 threads (adaptive: ", 0), 0u) << a.summary();
}

// A busy neighbour as it hits the CNN here: most 2-thread steps take about as long as 1-thread ones, one
// in eight takes 6x (the neighbour's time slice). The 2-thread median is 15 ms, the mean 24: the run moves
// to 1 thread.
TEST(ThreadAdapter, BusyMachineWithRareLongStepsMovesToFewerThreads) {
  ThreadAdapter a(2, true);
  const auto counts = drive(a, 600, [](int n, int step) {
    return n == 1 ? 0.0145 : step % 8 == 3 ? 0.090 : 0.015;
  });
  EXPECT_EQ(a.current(), 1);
  EXPECT_GE(count_of(counts, 1, 100), 480);
}

// Another phase of the busy MLP: its 2-thread steps alternate 2.3 and 6.3 ms, a mean no better than 4.2 ms
// at 1 thread but a median 1.5x worse. The run moves to 1 thread by the median.
TEST(ThreadAdapter, AlternatingStepsMoveByTheirMedian) {
  ThreadAdapter a(2, true);
  const auto counts = drive(a, 600, [](int n, int step) {
    return n == 1 ? 0.0042 : step % 2 ? 0.0063 : 0.0023;
  });
  EXPECT_EQ(a.current(), 1);
  EXPECT_GE(count_of(counts, 1, 100), 470);
}

// A busy neighbour as it hits the MLP here: 2-thread steps take 2.3 ms while it is off its core (three
// steps in ten, in a row) and 6.3 ms otherwise, against 4.2 at 1 thread. A lucky probe step at 2 threads
// does not take the run back to 2.
TEST(ThreadAdapter, OccasionallyFastStepsDoNotWin) {
  ThreadAdapter a(2, true);
  const auto counts = drive(a, 1000, [](int n, int step) {
    return n == 1 ? 0.0042 : step % 10 < 3 ? 0.0023 : 0.0063;
  });
  EXPECT_EQ(a.current(), 1);
  EXPECT_GE(count_of(counts, 1, 100), 870);
}

// An idle machine with stray long steps (two in a row at 10x, every 97 steps) stays at 2 threads.
TEST(ThreadAdapter, StrayLongStepsDoNotMove) {
  ThreadAdapter a(2, true);
  const auto counts = drive(a, 1000, [](int n, int step) {
    return n == 1 ? 0.18 : step % 97 < 2 ? 1.0 : 0.10;
  });
  EXPECT_EQ(a.current(), 2);
  EXPECT_LE(count_of(counts, 1), 14);
}

// The other process ends at step 200: the probes at 2 threads win and the run goes back to 2.
TEST(ThreadAdapter, ReturnsWhenTheMachineIsFreeAgain) {
  ThreadAdapter a(2, true);
  const auto counts = drive(a, 600, [](int n, int step) {
    const bool busy = step < 200;
    return n == 2 ? (busy ? 0.49 : 0.18) : 0.31;
  });
  EXPECT_EQ(a.current(), 2);
  EXPECT_EQ(counts[150], 1);
  EXPECT_GE(count_of(counts, 2, 400), 195);
}

// Noise of +-5% around equal times does not make it move.
TEST(ThreadAdapter, NoiseWithinTenPercentDoesNotMove) {
  ThreadAdapter a(4, true);
  drive(a, 500, [](int n, int step) { return 0.1 * (1.0 + 0.05 * ((step * 7 + n) % 3 - 1)); });
  EXPECT_EQ(a.current(), 4);
}

// With four cores and three free, it walks down one count at a time to the fastest.
TEST(ThreadAdapter, WalksToTheFastestCount) {
  ThreadAdapter a(4, true);
  const double time_at[] = {0, 0.40, 0.22, 0.15, 0.30};
  drive(a, 300, [&](int n, int) { return time_at[n]; });
  EXPECT_EQ(a.current(), 3);
}

// adapt_threads: false, or one thread: every step at the configured count.
TEST(ThreadAdapter, FixedWhenNotAdapting) {
  ThreadAdapter fixed(2, false), one(1, true);
  EXPECT_EQ(count_of(drive(fixed, 100, [](int n, int) { return n == 2 ? 1.0 : 0.1; }), 2), 100);
  EXPECT_EQ(count_of(drive(one, 20, [](int, int) { return 0.1; }), 1), 20);
  EXPECT_EQ(fixed.summary(), "2 threads");
}

// The loader prepares batches in its own thread only when a core is left over by the step's threads (or the
// step runs on a GPU); data.prefetch 0 stays synchronous everywhere.
TEST(LoaderPrefetch, BackgroundOnlyWithACoreToSpare) {
  const int cores = usable_cores();
  ASSERT_GE(cores, 1);
  RunConfig cfg;
  cfg.data.prefetch = 3;
  cfg.train.threads = cores;
  EXPECT_EQ(loader_prefetch(cfg), 0);
  cfg.train.threads = cores + 1;
  EXPECT_EQ(loader_prefetch(cfg), 0);
  cfg.train.device = "cuda";
  EXPECT_EQ(loader_prefetch(cfg), 3);
  cfg.train.device = "cpu";
  if (cores > 1) {
    cfg.train.threads = cores - 1;
    EXPECT_EQ(loader_prefetch(cfg), 3);
    cfg.data.prefetch = 0;
    EXPECT_EQ(loader_prefetch(cfg), 0);
  }
}

}  // namespace
}  // namespace flowrun::testing
