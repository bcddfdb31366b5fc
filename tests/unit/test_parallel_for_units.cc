// ops/cpu/parallel.h's parallel_for_units: every unit runs exactly once whatever the thread count, and a
// thread that finishes its share takes the units a slow thread has not reached.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "ops/cpu/parallel.h"

namespace flowrun {
namespace {

class ParallelForUnits : public ::testing::Test {
 protected:
  void TearDown() override { omp_set_num_threads(saved_); }
  int saved_ = omp_get_max_threads();
};

TEST_F(ParallelForUnits, RunsEveryUnitOnce) {
  for (int threads : {1, 2, 3, 4})
    for (int64_t n : {0, 1, 2, 5, 7, 1000}) {
      omp_set_num_threads(threads);
      std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
      cpu::parallel_for_units(n, [&](int64_t u) { runs[static_cast<size_t>(u)].fetch_add(1); });
      for (int64_t u = 0; u < n; ++u)
        EXPECT_EQ(runs[static_cast<size_t>(u)].load(), 1)
            << "unit " << u << " of " << n << ", " << threads << " threads";
    }
}

TEST_F(ParallelForUnits, AFinishedThreadTakesTheUnitsOfASlowOne) {
  // Thread 0 stalls on its first unit until 75 units have run: the other thread runs its own 50 and then
  // thread 0's from the back.
  omp_set_num_threads(2);
  constexpr int64_t n = 100;
  std::vector<int> ran_on(n, -1);
  std::atomic<int> done{0};
  cpu::parallel_for_units(n, [&](int64_t u) {
    const int t = omp_get_thread_num();
    if (t == 0 && u == 0) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (done.load() < 75 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    }
    ran_on[static_cast<size_t>(u)] = t;
    done.fetch_add(1);
  });
  if (omp_get_max_threads() < 2) GTEST_SKIP() << "no team of 2";
  for (int64_t u = 0; u < n; ++u) EXPECT_NE(ran_on[static_cast<size_t>(u)], -1) << "unit " << u;
  int taken = 0;
  for (int64_t u = 0; u < n / 2; ++u) taken += ran_on[static_cast<size_t>(u)] == 1;
  EXPECT_GE(taken, 25) << "units of thread 0's share run by thread 1";
  for (int64_t u = n / 2; u < n; ++u) EXPECT_EQ(ran_on[static_cast<size_t>(u)], 1) << "unit " << u;
}

}  // namespace
}  // namespace flowrun
