// A stop request is the first signal the routing thread (core/signals.h) takes while one is armed: the step
// loop polls it between steps.
#include "train/stop.h"

#include <signal.h>

#include "core/signals.h"

namespace flowrun {

StopRequests::StopRequests() {
  arm_stop_signals(true);
}

StopRequests::~StopRequests() {
  arm_stop_signals(false);
}

int StopRequests::signal() const {
  return stop_signal();
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
