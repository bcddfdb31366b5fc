// NCCL communicators (CUDA builds): the collectives of a GPU program, over device memory, between processes
// that each drive one GPU. They are made from a host communicator (MPI) over the same ranks, which carries
// NCCL's unique id; the trainer keeps using the host ones for everything that is not a kernel's (parameter
// scatter, checkpoints, metrics).
#pragma once

#include <memory>

#include "parallel/comm.h"

namespace flowrun {

// A device communicator over the ranks of `host` (collective: every rank of it calls this). Its collectives
// take device pointers and are enqueued on the CUDA stream given last to set_stream (the executor's; the
// default stream before), so that they are ordered with the kernels around them and can be captured in a
// CUDA graph: they return before the transfer is done. start_all_reduce runs the transfer on a stream of
// its own, after what the kernel stream has queued so far; wait() makes the kernel stream wait for it.
// Point-to-point transfers and split() are not offered: pipeline stages on GPUs are not supported yet.
class NcclCommunicator : public Communicator {
 public:
  virtual void set_stream(void* stream) = 0;
};

std::shared_ptr<NcclCommunicator> make_nccl_communicator(Communicator& host);

// Selects this process's GPU: local rank modulo the GPUs this node shows it (call before any other CUDA
// work). Returns the device index.
int select_gpu(int local_rank);

}  // namespace flowrun
