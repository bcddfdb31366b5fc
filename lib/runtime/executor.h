// The executor: owns a compiled Program's memory (one arena for intermediates, persistent buffers for
// inputs, parameters and state) and runs its kernels in schedule order. Everything is resolved when it is
// built, so a step allocates nothing.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "graph/passes.h"
#include "ops/registry.h"

namespace flowrun {

struct DeviceMirror;

// No inf or NaN among a float tensor's values (integer tensors have none): --detect-anomaly's test of each
// op's outputs, and the trainer's of the weights before a checkpoint.
bool all_finite(const TensorView& t);

// What an eager program's executor throws when a node's output holds an inf or NaN: the message names the
// node, its op and each input (non-finite count and largest magnitude), which the unshared memory still
// holds.
class NonFiniteValue : public Error {
 public:
  NonFiniteValue(const Node& node, const std::string& msg) : Error(ExitCode::runtime, msg), node_(&node) {}
  const Node& node() const { return *node_; }

 private:
  const Node* node_;
};

// An eager program's time in one op type (Executor::op_times).
struct OpTime {
  int64_t calls = 0;
  double seconds = 0;
};

class Executor {
 public:
  // `shared`: persistent tensors (by value name) to use instead of allocating new ones, so that an eval
  // program reads the training program's parameters and running statistics in place. Shapes and dtypes
  // must match the program's values.
  // `comm`: the data axis's group, `tp`: the tensor axis's, for collective ops (parallel programs); they
  // must outlive the executor.
  Executor(Program program, Device device = kCpu, uint64_t seed = 0,
           const std::map<std::string, Tensor>& shared = {}, Communicator* comm = nullptr,
           Communicator* tp = nullptr);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // On a GPU: run() records its kernels as a CUDA graph the second time it is called with a given `apply`
  // (the first call warms up what cannot be captured: cuBLASLt's algorithm choice, library handles) and
  // replays that graph from then on, one launch a step. A capture that fails (a kernel the runtime cannot
  // capture) is logged and the executor goes back to launching kernel by kernel. Nothing on the CPU.
  void use_cuda_graphs(bool on) { graphs_on_ = on; }

  // One step: every kernel in order, with dropout streams keyed by (seed, step, node). With apply = false
  // the nodes of phase 1 (optimizer updates under gradient accumulation) are skipped.
  void run(bool apply = true);
  // As run(), calling `timer(node, seconds)` after each kernel (for `flowrun time`).
  void run_timed(const std::function<void(const Node&, double)>& timer, bool apply = true);
  // As run(), checking every floating output after its kernel (--detect-anomaly): returns the first node that
  // produced an inf or NaN (the rest of the step is not run), or null. Under fp16 loss scaling the backward
  // pass is exempt: its overflows are expected and skip the step.
  const Node* run_checked(bool apply = true);
  // An eager program (Program::eager) does that check after every kernel in every kind of run, throwing
  // NonFiniteValue, and times every kernel: its time per op type so far, over all runs.
  const std::map<std::string, OpTime>& op_times() const { return op_times_; }

  // The kernels of order[begin, end) (a pipeline stage's forward or backward pass, Program::backward_begin)
  // with the dropout streams of step(), which is not advanced.
  // With apply_only, only the apply-phase (phase 1) nodes among them.
  void run_part(size_t begin, size_t end, bool apply, bool apply_only = false);
  // The pipeline axis's groups for collective ops (global_norm, the tied parameters' all_reduce).
  void set_pipeline(Communicator* pipeline, Communicator* ends);

  // Persistent tensors by value name: inputs (fed each step), params and state (trained / updated in place).
  // Always host tensors: on a GPU this copies the device's newer bytes back first, and the next run uploads
  // the tensor again (the caller may have written it).
  Tensor& tensor(const std::string& name);
  bool has_tensor(const std::string& name) const { return persistent_.count(name) != 0; }
  // On the CPU, the kernels read input `name` (a graph input, fed each step) from `t` itself, which then is
  // tensor(name), instead of from a copy: a batch is not copied each step. `t` (same shape and dtype) must
  // stay unchanged until the runs that read it end. False on a GPU, where the caller copies.
  bool bind_input(const std::string& name, const Tensor& t);
  // A named graph output (e.g. "loss", "grad/w1") as a view into the arena, valid until the next run().
  Tensor output(const std::string& name) const;
  // Any value, copied out of the arena: meaningful while it is live (in a run_timed callback, a node's inputs
  // and outputs; its inputs only if the program was compiled without in-place reuse).
  Tensor value(ValueId id) const;
  // The host tensors as they are (on a GPU, current only where tensor() was asked for since the last run).
  const std::map<std::string, Tensor>& persistent() const { return persistent_; }

  const Program& program() const { return program_; }
  int64_t step() const { return step_; }
  void set_step(int64_t s) { step_ = s; }
  // The micro-batch of the step the next runs compute (KernelCtx::micro): dropout numbers its elements as
  // rows of the step's whole batch, micro-batch m after the m before it.
  int64_t micro() const { return micro_; }
  void set_micro(int64_t m);
  uint64_t seed() const { return seed_; }

 private:
  // A conversion around a widened f16/bf16 kernel (see select_kernel): inputs to f32 before, results back
  // after.
  struct Convert {
    const void* src;
    DType from;
    void* dst;
    DType to;
    int64_t n;
  };
  struct Step {
    KernelFn fn;
    KernelCtx ctx;
    uint64_t stream;  // the node's RNG stream: by name, so that a rank's extra boxing nodes change nothing
    std::vector<Convert> widen_in, narrow_out;
  };
  static void execute(const Step& s);
  // One node of a run: its dropout stream for step_, the kernel, and in an eager program the check and the
  // time (after which `timer`, when given, receives the time too).
  void run_node(Step& s, const std::function<void(const Node&, double)>* timer = nullptr);
  // Whether every floating output of `s` is finite, read where it was stored (after a widened kernel's
  // rounding: f16 overflows there).
  bool outputs_finite(const Step& s) const;
  // Under fp16 loss scaling the backward pass may overflow (the step is then skipped and the scale lowered):
  // the nodes after the forward pass.
  bool may_overflow(const Node& n) const;
  // The NonFiniteValue for node `s`.
  NonFiniteValue non_finite(const Step& s) const;
  // On a GPU: before a run, copies to the device what the host changed; after it, waits for the kernels and
  // marks parameters and state newer on the device (see DeviceMirror). Nothing on the CPU.
  // Also writes step_ where the device's kernels read it.
  void upload_changed();
  void kernels_done();
  // run()'s kernels on a GPU with graphs on: warm-up, capture, or replay (see use_cuda_graphs).
  void run_graph(bool apply);
  Program program_;
  Device device_;
  uint64_t seed_;
  int64_t step_ = 0, micro_ = 0;
  std::shared_ptr<Storage> arena_;
  std::map<std::string, Tensor> persistent_;                      // on the host, whatever the device
  std::map<std::string, std::shared_ptr<DeviceMirror>> mirrors_;  // on a GPU: each one's device copy
  std::vector<TensorView> views_;  // all kernel inputs/outputs, referenced by Step::ctx
  std::vector<Step> steps_;
  // Where the kernels read each graph input (CPU): the views and widening conversions that bind_input
  // repoints.
  struct InputRefs {
    std::vector<size_t> views;
    std::vector<std::pair<size_t, size_t>> widened;  // (step, widen_in entry)
  };
  std::map<std::string, InputRefs> input_refs_;
  bool loss_scaled_ = false;  // the program has the state amp/loss_scale
  std::map<std::string, OpTime> op_times_;
  // On a GPU: the stream every kernel launches on, the step and micro-batch in device memory
  // (KernelCtx::device_step), and
  // the CUDA graphs of run(false) and run(true), once captured.
  void* stream_ = nullptr;
  int64_t* device_step_ = nullptr;
  bool graphs_on_ = false;
  void* graph_[2] = {nullptr, nullptr};
  bool warmed_[2] = {false, false};
};

}  // namespace flowrun
