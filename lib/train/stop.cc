// Signal handlers that only record the request: the step loop polls it between steps.
#include "train/stop.h"

#include <signal.h>

#include <atomic>

namespace flowrun {

namespace {

std::atomic<int> g_signal{0};
struct sigaction g_old_term, g_old_usr1, g_old_int;

void on_signal(int sig) {
  int expected = 0;
  if (g_signal.compare_exchange_strong(expected, sig)) return;
  // A second SIGTERM or SIGINT: end now, as the default action would (async-signal-safe calls only).
  if (sig == SIGTERM || sig == SIGINT) {
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

}  // namespace

StopRequests::StopRequests() {
  g_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, &g_old_term);
  sigaction(SIGUSR1, &sa, &g_old_usr1);
  sigaction(SIGINT, &sa, &g_old_int);
}

StopRequests::~StopRequests() {
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGUSR1, &g_old_usr1, nullptr);
  sigaction(SIGINT, &g_old_int, nullptr);
}

int StopRequests::signal() const {
  return g_signal.load();
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGINT:
      return "SIGINT";
    default:
      return "a signal";
  }
}

}  // namespace flowrun
