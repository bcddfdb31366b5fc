// The asynchronous signals a run answers (SIGTERM, SIGUSR1, SIGINT) reach a flowrun process through one
// thread of its own, which waits for them with sigwait; no handler ever runs on a compute thread.
//
// Why: a handler's frame is pushed onto the stack of the thread the signal lands on, and a compute thread's
// stack pointer is not always its stack. oneDNN's f32 sgemm kernels (jit_avx_gemm_f32, the no-copy kernel
// every product runs below AVX-512) point rsp at a heap workspace malloc'd for the call, so a frame pushed
// there overwrote the heap blocks below it: a gpt-tiny run that received signals during its products
// aborted ("corrupted size vs. prev_size") or crashed in 6 of 8 tries on a loaded Zen 3 host (valgrind shows
// the kernel's stack switch into a 16640-byte block of libdnnl's).
#pragma once

#include <signal.h>

namespace flowrun {

// Blocks the three signals in the calling thread, and so in every thread started after it, and starts the
// thread that takes them. main() calls it first, before any other thread exists (a thread started earlier
// would still take them with their default action). Without it they keep their default action: the
// process ends, and no stop is ever requested.
void route_signals();

// While armed (a StopRequests is alive), the first of the signals is kept (stop_signal()) and a later
// SIGTERM or SIGINT ends the process as its default action would. Unarmed, a SIGTERM or SIGINT ends it, and
// so does a SIGUSR1 until the first arming; after it a SIGUSR1 is ignored. Under mpirun or srun every rank
// gets its own copy, and a rank that stopped on another's request had ended its run before its copy came:
// killed by it, the run exited 138 instead of 3 (stopped), which a batch script requeues on. Arming forgets
// an earlier signal.
void arm_stop_signals(bool armed);

// The first signal taken while armed, or 0.
int stop_signal();

// The signals unblocked in the calling thread while alive: a child process started meanwhile (popen)
// inherits the thread's mask, and should end on Ctrl-C as any program does. A signal that lands on this
// thread meanwhile takes its default action, so no stop is requested through it.
class UnblockedSignals {
 public:
  UnblockedSignals();
  ~UnblockedSignals();
  UnblockedSignals(const UnblockedSignals&) = delete;
  UnblockedSignals& operator=(const UnblockedSignals&) = delete;

 private:
  sigset_t saved_;
};

}  // namespace flowrun
