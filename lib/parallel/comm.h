// Communicators: the collectives and point-to-point transfers the parallel passes' ops call, behind one
// interface with a backend per transport (MPI between CPU processes; NCCL comes with the CUDA backend). A
// world of one process needs no library at all.
#pragma once

#include <cstdint>
#include <memory>

#include "core/dtype.h"
#include "parallel/launch.h"

namespace flowrun {

enum class ReduceOp { sum, max };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;
  // In place over n elements of every rank's buffer; every rank ends with the same bits.
  virtual void all_reduce(void* data, int64_t n, DType t, ReduceOp op) = 0;
  virtual void broadcast(void* data, int64_t n, DType t, int root) = 0;
  // out (size() * n) = the n elements of every rank, in rank order.
  virtual void all_gather(const void* in, void* out, int64_t n, DType t) = 0;
  // out (n) = this rank's n-element block of the reduction of every rank's in (size() * n).
  virtual void reduce_scatter(const void* in, void* out, int64_t n, DType t, ReduceOp op) = 0;
  virtual void send(const void* data, int64_t n, DType t, int peer, int tag = 0) = 0;
  virtual void recv(void* data, int64_t n, DType t, int peer, int tag = 0) = 0;
  // A send that returns at once: the data is copied, and the transfer completes in the background (messages
  // to one peer with one tag arrive in posting order). flush() waits for every posted send.
  virtual void post(const void* data, int64_t n, DType t, int peer, int tag) = 0;
  virtual void flush() = 0;
  virtual void barrier() = 0;
  // An in-place all-reduce that returns at once; `wait` (with the returned handle) completes it, after which
  // the data holds the result. Until then the data must be left alone.
  virtual int64_t start_all_reduce(void* data, int64_t n, DType t, ReduceOp op) = 0;
  virtual void wait(int64_t handle) = 0;
  // The ranks with the same color, ordered by key (collective: every rank calls it).
  virtual std::shared_ptr<Communicator> split(int color, int key) = 0;
};

// Elements per rank when n elements are split into `shards` equal flat shards (the last ones zero-padded).
inline int64_t shard_size(int64_t n, int64_t shards) { return (n + shards - 1) / shards; }

// The communicator of a one-process world: every collective is the identity.
std::unique_ptr<Communicator> make_single_communicator();

// A run's device mesh over the world's ranks, pipeline-major, then data, then tensor (the ranks of one
// tensor-parallel group are adjacent, as in Megatron-LM): world rank = (stage x data + data index) x tensor +
// tensor index. Each axis's communicator connects this rank with those that differ from it on that axis
// only: `data` (gradient all-reduce, ZeRO), `tensor` (tensor-parallel boxing), `pipeline` (activations and
// their gradients between stages). `ends` connects the first and the last stage (parameters both hold: tied
// embeddings).
struct Mesh {
  std::shared_ptr<Communicator> world, data, tensor, pipeline, ends;
  // A GPU program's kernels move device memory: on GPUs each axis of more than one rank gets an NCCL
  // communicator too (parallel/cuda/nccl.h), over the same ranks. Null otherwise.
  std::shared_ptr<Communicator> gpu_data, gpu_tensor, gpu_pipeline, gpu_ends;
  // The groups for the kernels' collectives (KernelCtx::comm, tp, pp and ends).
  Communicator* kernel_data() const { return gpu_data ? gpu_data.get() : data.get(); }
  Communicator* kernel_tensor() const { return gpu_tensor ? gpu_tensor.get() : tensor.get(); }
  Communicator* kernel_pipeline() const { return gpu_pipeline ? gpu_pipeline.get() : pipeline.get(); }
  Communicator* kernel_ends() const { return gpu_ends ? gpu_ends.get() : ends.get(); }
  int64_t stage() const { return pipeline ? pipeline->rank() : 0; }
  int64_t stages() const { return pipeline ? pipeline->size() : 1; }
};
// Splits `world` into a pipeline x data x tensor mesh (collective); world->size() must be a multiple of
// tensor x pipeline.
Mesh make_mesh(std::shared_ptr<Communicator> world, int64_t tensor, int64_t pipeline = 1);

// The world of a launched job: MPI when `launch.world` > 1 (MPI_Init on first use, finalized when the last
// reference goes), the single-process communicator otherwise.
std::shared_ptr<Communicator> world_communicator(const LaunchInfo& launch);

}  // namespace flowrun
