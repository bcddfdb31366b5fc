// The single-process communicator and the MPI backend.
#include "parallel/comm.h"

#include <mpi.h>

#include <cstring>
#include <exception>
#include <list>
#include <map>
#include <vector>

#include "core/error.h"

namespace flowrun {

namespace {

class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "single"; }
  void all_reduce(void*, int64_t, DType, ReduceOp) override {}
  void broadcast(void*, int64_t, DType, int) override {}
  void all_gather(const void* in, void* out, int64_t n, DType t) override { copy(in, out, n, t); }
  void reduce_scatter(const void* in, void* out, int64_t n, DType t, ReduceOp) override {
    copy(in, out, n, t);
  }
  void send(const void*, int64_t, DType, int peer, int) override { no_peer(peer); }
  void recv(void*, int64_t, DType, int peer, int) override { no_peer(peer); }
  void post(const void*, int64_t, DType, int peer, int) override { no_peer(peer); }
  void flush() override {}
  void barrier() override {}
  int64_t start_all_reduce(void*, int64_t, DType, ReduceOp) override { return 0; }
  void wait(int64_t) override {}
  std::shared_ptr<Communicator> split(int, int) override { return std::make_shared<SingleCommunicator>(); }

 private:
  static void copy(const void* in, void* out, int64_t n, DType t) {
    if (in != out) std::memmove(out, in, static_cast<size_t>(n) * dtype_size(t));
  }
  [[noreturn]] static void no_peer(int peer) { FR_CHECK(false, "a one-process world has no peer ", peer); }
};

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::u8:
      return MPI_UINT8_T;
    default:
      FR_CHECK(false, "MPI collectives take f32, f64 and integers, not ", dtype_name(t));
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op) {
  return op == ReduceOp::sum ? MPI_SUM : MPI_MAX;
}

// MPI counts are int: every call here moves fewer than 2^31 elements (checked).
int count(int64_t n) {
  FR_CHECK(n >= 0 && n < (int64_t{1} << 31), "MPI transfer of ", n, " elements");
  return static_cast<int>(n);
}

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw runtime_error(cat("MPI ", what, " failed: ", std::string(msg, static_cast<size_t>(len))));
}

class MpiCommunicator final : public Communicator, public std::enable_shared_from_this<MpiCommunicator> {
 public:
  explicit MpiCommunicator(const LaunchInfo& launch) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      // Only the main thread calls MPI (the loader thread and OpenMP workers never do).
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "init");
      owner_ = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    if (rank_ != launch.rank || size_ != launch.world)
      throw input_error(cat("the launcher's environment (", launch.source, ") says rank ", launch.rank,
                            " of ", launch.world, " but MPI says rank ", rank_, " of ", size_,
                            " (Debian's OpenMPI under srun needs --mpi=pmix)"));
  }
  // A sub-communicator; `parent` (the world) stays alive while it does, so MPI is finalized last.
  MpiCommunicator(MPI_Comm comm, std::shared_ptr<Communicator> parent) : comm_(comm), parent_(std::move(parent)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    // Unwinding an error: freeing communicators and finalizing are collective and would wait for ranks that
    // wait for this one. Exiting without them makes mpirun (or srun) end the whole job, naming this rank.
    if (std::uncaught_exceptions() > 0) return;
    if (comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
    if (owner_) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }
  void all_reduce(void* data, int64_t n, DType t, ReduceOp op) override {
    check(MPI_Allreduce(MPI_IN_PLACE, data, count(n), mpi_type(t), mpi_op(op), comm_), "all-reduce");
  }
  void broadcast(void* data, int64_t n, DType t, int root) override {
    check(MPI_Bcast(data, count(n), mpi_type(t), root, comm_), "broadcast");
  }
  void all_gather(const void* in, void* out, int64_t n, DType t) override {
    check(MPI_Allgather(in, count(n), mpi_type(t), out, count(n), mpi_type(t), comm_), "all-gather");
  }
  void reduce_scatter(const void* in, void* out, int64_t n, DType t, ReduceOp op) override {
    check(MPI_Reduce_scatter_block(in, out, count(n), mpi_type(t), mpi_op(op), comm_),
          "reduce-scatter");
  }
  void send(const void* data, int64_t n, DType t, int peer, int tag) override {
    check(MPI_Send(data, count(n), mpi_type(t), peer, tag, comm_), "send");
  }
  void recv(void* data, int64_t n, DType t, int peer, int tag) override {
    check(MPI_Recv(data, count(n), mpi_type(t), peer, tag, comm_, MPI_STATUS_IGNORE), "recv");
  }
  void post(const void* data, int64_t n, DType t, int peer, int tag) override {
    // Completed sends give their buffers back first, so that the list stays as long as what is in flight.
    posted_.remove_if([](Posted& p) {
      int done = 0;
      check(MPI_Test(&p.request, &done, MPI_STATUS_IGNORE), "send test");
      return done != 0;
    });
    Posted& p = posted_.emplace_back();
    p.bytes.assign(static_cast<const char*>(data), static_cast<const char*>(data) + n * static_cast<int64_t>(dtype_size(t)));
    check(MPI_Isend(p.bytes.data(), count(n), mpi_type(t), peer, tag, comm_, &p.request), "send");
  }
  void flush() override {
    for (Posted& p : posted_) check(MPI_Wait(&p.request, MPI_STATUS_IGNORE), "send wait");
    posted_.clear();
  }
  void barrier() override { check(MPI_Barrier(comm_), "barrier"); }
  int64_t start_all_reduce(void* data, int64_t n, DType t, ReduceOp op) override {
    MPI_Request r;
    check(MPI_Iallreduce(MPI_IN_PLACE, data, count(n), mpi_type(t), mpi_op(op), comm_, &r), "all-reduce start");
    requests_[next_handle_] = r;
    return next_handle_++;
  }
  void wait(int64_t handle) override {
    auto it = requests_.find(handle);
    FR_CHECK(it != requests_.end(), "no collective in flight with handle ", handle);
    check(MPI_Wait(&it->second, MPI_STATUS_IGNORE), "all-reduce wait");
    requests_.erase(it);
  }
  std::shared_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color, key, &sub), "comm split");
    return std::make_shared<MpiCommunicator>(sub, shared_from_this());
  }

 private:
  int rank_ = 0, size_ = 1;
  bool owner_ = false;
  struct Posted {
    std::vector<char> bytes;
    MPI_Request request;
  };
  std::list<Posted> posted_;
  std::map<int64_t, MPI_Request> requests_;  // started collectives by handle
  int64_t next_handle_ = 0;
  MPI_Comm comm_ = MPI_COMM_WORLD;
  std::shared_ptr<Communicator> parent_;
};

}  // namespace

std::unique_ptr<Communicator> make_single_communicator() {
  return std::make_unique<SingleCommunicator>();
}

Mesh make_mesh(std::shared_ptr<Communicator> world, int64_t tensor, int64_t pipeline) {
  const int w = world->size(), r = world->rank(), t = static_cast<int>(tensor), p = static_cast<int>(pipeline);
  FR_CHECK(t >= 1 && p >= 1 && w % (t * p) == 0, "a world of ", w, " ranks has no ", pipeline, " x ", tensor,
           " mesh");
  const int d = w / (t * p);
  const int ti = r % t, di = r / t % d, pi = r / (t * d);
  // An axis of one rank needs no communicator of its own; the world's is reused when the axis spans it.
  // Every rank makes the same calls in the same order: splits are collective.
  auto axis = [&](int size, int color, int key) -> std::shared_ptr<Communicator> {
    if (size == w) return world;
    if (size == 1) return make_single_communicator();
    return world->split(color, key);
  };
  Mesh m;
  m.data = axis(d, pi * t + ti, di);
  m.tensor = axis(t, pi * d + di, ti);
  m.pipeline = axis(p, di * t + ti, pi);
  // The first and last stages of each pipeline (the same as the pipeline axis for 2 stages).
  const bool end = pi == 0 || pi == p - 1;
  m.ends = p <= 2 ? m.pipeline : world->split(end ? di * t + ti : d * t + r, pi);
  m.world = std::move(world);
  return m;
}

std::shared_ptr<Communicator> world_communicator(const LaunchInfo& launch) {
  if (launch.world <= 1) return make_single_communicator();
  return std::make_shared<MpiCommunicator>(launch);
}

}  // namespace flowrun
