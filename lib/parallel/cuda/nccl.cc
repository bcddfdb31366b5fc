// The NCCL backend of the device communicators (see parallel/nccl.h).
#include "parallel/cuda/nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <exception>
#include <vector>

#include "core/cuda/runtime.h"
#include "core/error.h"

namespace flowrun {

namespace {

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw runtime_error(cat("NCCL ", what, " failed: ", ncclGetErrorString(r)));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
  }
  FR_CHECK(false, "NCCL has no type for ", dtype_name(t));
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::sum ? ncclSum : ncclMax;
}

size_t count(int64_t n) {
  FR_CHECK(n >= 0, "NCCL transfer of ", n, " elements");
  return static_cast<size_t>(n);
}

class Nccl final : public NcclCommunicator {
 public:
  Nccl(ncclComm_t comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {
    cuda::check(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  }
  ~Nccl() override {
    // While an error unwinds, peers may never join a collective this rank left in flight: abort rather
    // than wait for it, as the MPI backend exits without finalizing.
    if (std::uncaught_exceptions() > 0)
      ncclCommAbort(comm_);
    else
      ncclCommDestroy(comm_);
    for (const Transfer& t : transfers_) {
      cudaEventDestroy(t.ready);
      cudaEventDestroy(t.done);
    }
    if (scratch_) cuda::free(scratch_);
    cudaStreamDestroy(side_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }
  void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }

  void all_reduce(void* data, int64_t n, DType t, ReduceOp op) override {
    check_nccl(ncclAllReduce(data, data, count(n), nccl_type(t), nccl_op(op), comm_, stream_), "all-reduce");
  }
  void broadcast(void* data, int64_t n, DType t, int root) override {
    check_nccl(ncclBroadcast(data, data, count(n), nccl_type(t), root, comm_, stream_), "broadcast");
  }
  void all_gather(const void* in, void* out, int64_t n, DType t) override {
    check_nccl(ncclAllGather(in, out, count(n), nccl_type(t), comm_, stream_), "all-gather");
  }
  void reduce_scatter(const void* in, void* out, int64_t n, DType t, ReduceOp op) override {
    check_nccl(ncclReduceScatter(in, out, count(n), nccl_type(t), nccl_op(op), comm_, stream_),
               "reduce-scatter");
  }
  void send(const void*, int64_t, DType, int, int) override { no_p2p(); }
  void recv(void*, int64_t, DType, int, int) override { no_p2p(); }
  void post(const void*, int64_t, DType, int, int) override { no_p2p(); }
  void flush() override {}
  void barrier() override {
    if (!scratch_) scratch_ = cuda::alloc(sizeof(float));
    all_reduce(scratch_, 1, DType::f32, ReduceOp::sum);
    cuda::check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  int64_t start_all_reduce(void* data, int64_t n, DType t, ReduceOp op) override {
    // The transfer starts after the kernels queued so far (which wrote its data) and runs beside the ones
    // queued after it; its pair of events is reused once waited for.
    size_t h = 0;
    while (h < transfers_.size() && transfers_[h].busy) ++h;
    if (h == transfers_.size()) {
      Transfer fresh;
      cuda::check(cudaEventCreateWithFlags(&fresh.ready, cudaEventDisableTiming), "cudaEventCreate");
      cuda::check(cudaEventCreateWithFlags(&fresh.done, cudaEventDisableTiming), "cudaEventCreate");
      transfers_.push_back(fresh);
    }
    Transfer& tr = transfers_[h];
    cuda::check(cudaEventRecord(tr.ready, stream_), "cudaEventRecord");
    cuda::check(cudaStreamWaitEvent(side_, tr.ready, 0), "cudaStreamWaitEvent");
    check_nccl(ncclAllReduce(data, data, count(n), nccl_type(t), nccl_op(op), comm_, side_), "all-reduce");
    cuda::check(cudaEventRecord(tr.done, side_), "cudaEventRecord");
    tr.busy = true;
    return static_cast<int64_t>(h);
  }
  void wait(int64_t handle) override {
    FR_CHECK(handle >= 0 && static_cast<size_t>(handle) < transfers_.size() &&
                 transfers_[static_cast<size_t>(handle)].busy,
             "no collective in flight with handle ", handle);
    Transfer& tr = transfers_[static_cast<size_t>(handle)];
    cuda::check(cudaStreamWaitEvent(stream_, tr.done, 0), "cudaStreamWaitEvent");
    tr.busy = false;
  }
  std::shared_ptr<Communicator> split(int, int) override {
    FR_CHECK(false, "NCCL communicators are made from host ones: split the host communicator");
    return nullptr;
  }

 private:
  [[noreturn]] static void no_p2p() {
    FR_CHECK(false, "point-to-point transfers between GPUs (pipeline stages) are not supported yet");
  }
  struct Transfer {
    cudaEvent_t ready = nullptr, done = nullptr;
    bool busy = false;
  };
  ncclComm_t comm_;
  int rank_, size_;
  cudaStream_t stream_ = nullptr;  // the kernels' (null: the default stream)
  cudaStream_t side_ = nullptr;    // started all-reduces
  std::vector<Transfer> transfers_;
  void* scratch_ = nullptr;
};

}  // namespace

std::shared_ptr<NcclCommunicator> make_nccl_communicator(Communicator& host) {
  ncclUniqueId id{};
  if (host.rank() == 0) check_nccl(ncclGetUniqueId(&id), "unique id");
  host.broadcast(&id, sizeof id, DType::u8, 0);
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, host.size(), id, host.rank()), "communicator set-up");
  return std::make_shared<Nccl>(comm, host.rank(), host.size());
}

int select_gpu(int local_rank) {
  std::string why;
  const int n = cuda::device_count(&why);
  FR_CHECK(n > 0, "no CUDA device is visible (", why, ")");
  const int device = local_rank % n;
  cuda::check(cudaSetDevice(device), "cudaSetDevice");
  return device;
}

}  // namespace flowrun
