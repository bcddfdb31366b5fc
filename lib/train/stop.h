// Stopping a run cleanly: SIGTERM and SIGUSR1 (what Slurm sends before preemption or the time limit) ask the
// trainer to finish its step, checkpoint and exit with ExitCode::stopped; a second SIGTERM or SIGINT ends the
// process at once.
#pragma once

namespace flowrun {

class StopRequests {
 public:
  // Installs the handlers (restoring the previous ones when destroyed).
  StopRequests();
  ~StopRequests();
  StopRequests(const StopRequests&) = delete;
  StopRequests& operator=(const StopRequests&) = delete;
  // The first signal received, or 0.
  int signal() const;
};

const char* signal_name(int sig);

}  // namespace flowrun
