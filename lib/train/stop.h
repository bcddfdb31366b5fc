// Stopping a run cleanly: SIGTERM and SIGUSR1 (what Slurm sends before preemption or the time limit) ask the
// trainer to finish its step, checkpoint and exit with ExitCode::stopped; a second SIGTERM or SIGINT ends the
// process at once. The signals come through core/signals.h's routing, which main() starts: without it they
// end the process and no stop is requested.
#pragma once

namespace flowrun {

class StopRequests {
 public:
  // Arms the stop signals while alive (arm_stop_signals).
  StopRequests();
  ~StopRequests();
  StopRequests(const StopRequests&) = delete;
  StopRequests& operator=(const StopRequests&) = delete;
  // The first signal received, or 0.
  int signal() const;
};

const char* signal_name(int sig);

}  // namespace flowrun
