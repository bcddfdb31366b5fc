// core/signals.h: the stop signals reach one thread of their own. Each case runs in a child process that
// routes them itself, since routing must come before any other thread and the test binary has OpenMP's.
#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <thread>

#include "core/signals.h"

namespace flowrun {
namespace {

// Runs `child` in a forked process and returns its wait status; the child's checks exit with a code of
// their own when they fail.
int in_child(const std::function<void()>& child) {
  const pid_t pid = fork();
  if (pid == 0) {
    child();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

bool blocks(int sig) {
  sigset_t mask;
  pthread_sigmask(SIG_BLOCK, nullptr, &mask);
  return sigismember(&mask, sig) == 1;
}

// Waits up to 5 s for stop_signal() to become `sig`.
bool taken(int sig) {
  for (int i = 0; i < 5000 && stop_signal() != sig; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return stop_signal() == sig;
}

TEST(Signals, ThreadsStartedAfterRoutingBlockThem) {
  const int status = in_child([] {
    route_signals();
    bool all = blocks(SIGTERM) && blocks(SIGUSR1) && blocks(SIGINT);
    std::thread([&all] { all = all && blocks(SIGTERM) && blocks(SIGUSR1) && blocks(SIGINT); }).join();
    if (!all) _exit(10);
    {
      const UnblockedSignals child_mask;
      if (blocks(SIGTERM) || blocks(SIGINT)) _exit(11);
    }
    if (!blocks(SIGTERM)) _exit(12);
  });
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(Signals, ArmedTheFirstIsKeptAndASecondSigtermEnds) {
  const int status = in_child([] {
    route_signals();
    arm_stop_signals(true);
    kill(getpid(), SIGUSR1);
    if (!taken(SIGUSR1)) _exit(10);
    kill(getpid(), SIGUSR1);  // a later SIGUSR1 is ignored
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (stop_signal() != SIGUSR1) _exit(11);
    kill(getpid(), SIGTERM);
    std::this_thread::sleep_for(std::chrono::seconds(5));
    _exit(12);
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit status " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
}

TEST(Signals, UnarmedTheyEndTheProcessButSigusr1OnlyBeforeTheFirstArming) {
  const int before = in_child([] {
    route_signals();
    kill(getpid(), SIGUSR1);
    std::this_thread::sleep_for(std::chrono::seconds(5));
    _exit(10);
  });
  ASSERT_TRUE(WIFSIGNALED(before)) << "exit status " << WEXITSTATUS(before);
  EXPECT_EQ(WTERMSIG(before), SIGUSR1);
  const int after = in_child([] {
    route_signals();
    arm_stop_signals(true);
    arm_stop_signals(false);
    kill(getpid(), SIGUSR1);  // a rank's late copy of the signal that stopped the run
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (stop_signal() != 0) _exit(11);
    kill(getpid(), SIGINT);
    std::this_thread::sleep_for(std::chrono::seconds(5));
    _exit(12);
  });
  ASSERT_TRUE(WIFSIGNALED(after)) << "exit status " << WEXITSTATUS(after);
  EXPECT_EQ(WTERMSIG(after), SIGINT);
}

}  // namespace
}  // namespace flowrun
