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
  virtual void send(const void* data, int64_t n, DType t, int peer) = 0;
  virtual void recv(void* data, int64_t n, DType t, int peer) = 0;
  virtual void barrier() = 0;
  // The ranks with the same color, ordered by key (collective: every rank calls it).
  virtual std::shared_ptr<Communicator> split(int color, int key) = 0;
};

// Elements per rank when n elements are split into `shards` equal flat shards (the last ones zero-padded).
inline int64_t shard_size(int64_t n, int64_t shards) { return (n + shards - 1) / shards; }

// The communicator of a one-process world: every collective is the identity.
std::unique_ptr<Communicator> make_single_communicator();

// A run's device mesh over the world's ranks, data-major (the ranks of one tensor-parallel group are
// adjacent, as in Megatron-LM): world rank = data index x tensor + tensor index. `data` connects the ranks
// with this rank's tensor index (gradient all-reduce, ZeRO), `tensor` those with its data index.
struct Mesh {
  std::shared_ptr<Communicator> world, data, tensor;
  int64_t data_size() const { return data->size(); }
  int64_t tensor_size() const { return tensor->size(); }
};
// Splits `world` into a data x tensor mesh (collective); world->size() must be data x tensor.
Mesh make_mesh(std::shared_ptr<Communicator> world, int64_t tensor);

// The world of a launched job: MPI when `launch.world` > 1 (MPI_Init on first use, finalized when the last
// reference goes), the single-process communicator otherwise.
std::shared_ptr<Communicator> world_communicator(const LaunchInfo& launch);

}  // namespace flowrun
