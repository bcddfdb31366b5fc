#include "core/signals.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "core/error.h"

namespace flowrun {

namespace {

std::atomic<bool> g_armed{false}, g_was_armed{false};
std::atomic<int> g_signal{0};

sigset_t routed_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  sigaddset(&set, SIGINT);
  return set;
}

// Ends the process as `sig`'s default action would, so that a shell or Slurm sees the signal in its status.
[[noreturn]] void die_of(int sig) {
  signal(sig, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  raise(sig);
  _exit(128 + sig);  // not reached: the default action of all three ends the process
}

}  // namespace

void route_signals() {
  static bool routed = false;
  if (routed) return;
  routed = true;
  const sigset_t set = routed_set();
  FR_CHECK(pthread_sigmask(SIG_BLOCK, &set, nullptr) == 0, "cannot block the stop signals");
  std::thread([set] {
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) continue;
      int none = 0;
      if (g_armed && g_signal.compare_exchange_strong(none, sig)) continue;
      if (sig == SIGUSR1 && g_was_armed) continue;
      die_of(sig);
    }
  }).detach();
}

void arm_stop_signals(bool armed) {
  g_signal = 0;
  g_armed = armed;
  if (armed) g_was_armed = true;
}

int stop_signal() {
  return g_signal.load();
}

UnblockedSignals::UnblockedSignals() {
  const sigset_t set = routed_set();
  pthread_sigmask(SIG_UNBLOCK, &set, &saved_);
}

UnblockedSignals::~UnblockedSignals() {
  pthread_sigmask(SIG_SETMASK, &saved_, nullptr);
}

}  // namespace flowrun
