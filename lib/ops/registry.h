// The op registry: every op is defined once here-by-name with its shape/dtype inference, gradient (as graph
// nodes), cost, memory behaviour, kernels per device, and the sample cases the generic tests run.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "graph/ir.h"
#include "parallel/sbp_rules.h"

namespace flowrun {

class GraphBuilder;
class Communicator;

// A tensor as a kernel sees it: a raw pointer into the arena (or a persistent buffer) plus its type.
struct TensorView {
  void* data = nullptr;
  const Shape* shape = nullptr;
  DType dtype = DType::f32;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  int64_t numel() const { return flowrun::numel(*shape); }
  int64_t dim(int i) const {
    return (*shape)[static_cast<size_t>(i < 0 ? i + static_cast<int>(shape->size()) : i)];
  }
  size_t rank() const { return shape->size(); }
};

struct KernelCtx {
  const Node* node = nullptr;
  const TensorView* in = nullptr;
  int num_in = 0;
  const TensorView* out = nullptr;
  int num_out = 0;
  void* workspace = nullptr;  // workspace_bytes() of the op, planned in the arena
  size_t workspace_bytes = 0;
  RngStream rng;                 // seeded from (run seed, step, node) by the executor
  Communicator* comm = nullptr;  // the data axis's group, for its collectives; null in a one-process program
  Communicator* tp = nullptr;    // the tensor axis's group; null without tensor parallelism
  Communicator* pp = nullptr;    // the pipeline axis's group; null without pipeline parallelism
  Communicator* ends = nullptr;  // the pipeline's first and last stages (all_reduce {group: ends})
  void* stream = nullptr;        // CUDA kernels: the cudaStream_t to launch on (null: the default stream)
  // The micro-batch of the optimizer step this run computes (gradient accumulation, pipeline micro-batches):
  // random ops number their elements as if this micro-batch were rows micro * b.. of the step's whole batch
  // along axis 0 (b its rows), so that any split of the batch draws what the whole batch would.
  int64_t micro = 0;
  // CUDA kernels that draw random numbers key them on the step read from device memory, not on `rng`: a
  // replayed CUDA graph keeps its launch arguments, so the per-step part must live on the device.
  // rng.stream = mix_stream(device_step[0], node_stream); device_step[1] is `micro`.
  const int64_t* device_step = nullptr;
  uint64_t node_stream = 0;
  const Attrs& attrs() const { return node->attrs; }
};

using KernelFn = void (*)(const KernelCtx&);

struct KernelDef {
  DeviceKind device = DeviceKind::cpu;
  std::vector<DType> dtypes;  // dtypes of the op's primary (first floating) input that this kernel handles
  KernelFn fn = nullptr;
  // Whether this machine can run the kernel fast (e.g. bf16 GEMMs need avx512_bf16); null = always.
  bool (*available)() = nullptr;
  // This kernel's scratch bytes where they differ from OpDef::workspace (a device library's own workspace,
  // e.g. cuDNN's convolutions); null: the op's.
  std::function<size_t(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&)>
      workspace = nullptr;
  // Memory the kernel's library keeps outside the arena for this call, as (pool, bytes): each pool is shared
  // by every call and grows to its largest need; pools add up (oneDNN's convolution scratchpad and reorder
  // buffers). `flowrun plan` adds them to its prediction of the process. null: none.
  std::function<std::vector<std::pair<std::string, size_t>>(const std::vector<TensorType>& in,
                                                            const std::vector<TensorType>& out, const Attrs&)>
      host_buffers = nullptr;
  // Inputs that this kernel takes in f32 when its primary input is f16/bf16: the parameters and statistics of
  // a mixed-precision norm (bf16 activations, f32 gamma, beta and running statistics, as PyTorch's and
  // cuDNN's batchnorm take them). The mixed-precision pass keeps such an op's activations in the low dtype
  // only where the device's kernel says so (AmpPolicy::norm). Empty: every floating input in its dtype.
  std::vector<int> f32_inputs = {};
};

struct Cost {
  double flops = 0;
  double bytes = 0;  // bytes read + written
};

// Given in gradient functions: the node being differentiated and its output gradients.
struct GradCtx {
  GraphBuilder& b;
  const Node& node;
  const std::vector<ValueId>& out_grads;  // kNoValue where no gradient flows into that output
  ValueId in(int i) const { return node.inputs.at(static_cast<size_t>(i)); }
  ValueId out(int i) const { return node.outputs.at(static_cast<size_t>(i)); }
  // Gradient of output i, materialised as zeros where none flows.
  ValueId dout(int i) const;
  const Attrs& attrs() const { return node.attrs; }
};

// A sample invocation of an op for the generic tests (gradient check, forward reference, planner).
struct OpSample {
  std::string label;
  std::vector<TensorType> inputs;  // dtype f64 for floating inputs in gradient checks
  Attrs attrs;
  // Input generator: fill input i of the case (defaults: uniform [-1, 1] for floats).
  std::function<void(int i, Tensor& t, uint64_t seed)> fill;
  // Optional reference forward in f64: given inputs, produce the expected outputs.
  std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs, const Attrs& attrs)> reference;
  double tolerance = 1e-6;  // relative tolerance of the finite-difference check
  bool gradcheck = true;    // false for samples whose outputs are not f64 (e.g. a cast to bf16)
};

// An OpSample::fill: uniform [-1, 1] by default; `constants` (input -> value) for inputs that must hold a
// given value (an optimizer's lr, step and coefficient; a decode step's position); inputs
// [nonnegative_begin, nonnegative_end) get [0, 1) (Adam's second moments).
std::function<void(int, Tensor&, uint64_t)> sample_fill(std::map<int, double> constants,
                                                        int nonnegative_begin = 0, int nonnegative_end = 0);

struct OpDef {
  std::string name;
  std::string doc;
  int num_inputs = 1;  // -1: variadic (at least one)
  // -1: one per input (variadic buckets such as all_reduce)
  std::function<int(const Attrs&)> num_outputs = [](const Attrs&) { return 1; };
  // Output types from input types; throws input_error on bad shapes/attrs.
  std::function<std::vector<TensorType>(const std::vector<TensorType>&, const Attrs&)> infer;
  // Input gradients as graph nodes; empty function = not differentiable (a backward helper or update op).
  std::function<std::vector<ValueId>(GradCtx&)> grad;
  std::function<Cost(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&)>
      cost;
  // Scratch bytes a kernel needs (e.g. im2col), planned in the arena so kernels never allocate.
  std::function<size_t(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&)>
      workspace;
  std::vector<int> nondiff_inputs;   // inputs that never get a gradient (labels, indices, state)
  std::vector<int> nondiff_outputs;  // outputs that are saved statistics, not differentiable results
  int inplace_input = -1;            // output 0 may reuse this input's buffer when it dies here
  // Output 0 is input 0's bytes under another shape: the planner gives both one buffer (whatever their
  // lifetimes), so the kernel finds out == in and copies nothing.
  bool view = false;
  std::vector<int> mutates;  // inputs updated in place (optimizer state, running statistics)
  // Instead of `mutates`, for variadic ops whose mutated inputs depend on their attrs and input count (the
  // multi-tensor updates); read both through mutated_inputs and updates_in_place.
  std::function<std::vector<int>(const Attrs&, int num_inputs)> mutates_of;
  bool random = false;       // draws from its KernelCtx::rng
  // Scheduled as soon as its inputs are ready, ahead of other ready nodes: a collective started early
  // overlaps the computation scheduled after it (all_reduce_start).
  bool eager = false;
  // The ways it runs split over a mesh axis (parallel/sbp_rules.h), for SBP deduction; unset: replicated only
  // (every input whole). Random ops lose the grouped-split ones (see without_grouped_outputs).
  std::function<std::vector<SbpSignature>(const SbpQuery&)> sbp;
  std::vector<KernelDef> kernels;
  std::function<std::vector<OpSample>()> samples;
  // Ops whose gradient checks exercise this one, for backward helpers that have no samples of their own.
  std::vector<std::string> covered_by;

  const KernelDef* kernel(DeviceKind d, DType t) const;
  // The inputs a node of this op updates in place.
  std::vector<int> mutated_inputs(const Attrs& attrs, int num_inputs) const {
    return mutates_of ? mutates_of(attrs, num_inputs) : mutates;
  }
  bool updates_in_place() const { return mutates_of || !mutates.empty(); }
};

// How a node's kernel runs. An f16/bf16 node of an op without a native kernel for that dtype runs the op's
// f32 kernel "widened": the executor converts its low-precision inputs to f32 in the node's workspace and
// rounds the f32 results back to nearest-even, so storage and rounding at every op boundary are real and the
// arithmetic inside the op is f32, as in a GPU kernel. Ops that mutate inputs in place are never widened.
struct KernelChoice {
  const KernelDef* kernel = nullptr;
  bool widened = false;
};
KernelChoice select_kernel(const OpDef& def, DeviceKind d, DType t);

// The dtype of a matmul's, linear's or reduce_sum's result: its operands' dtype, or f32 under attribute
// out_dtype: f32 on f16/bf16 operands, where the CPU kernel writes its f32 sum without rounding it (set by
// graph/amp.cc's fold_f32_casts only, where a cast to f32 was the result's one reader).
DType result_dtype(DType operands, const Attrs& a);

// A node's workspace: for a widened node an f32 buffer per low-precision input and output (-1 where a
// tensor is passed as it is), then the kernel's own workspace (KernelDef::workspace, else the op's), sized
// for the types the kernel sees.
struct WorkspaceLayout {
  size_t bytes = 0;
  std::vector<int64_t> in_offset, out_offset;
  size_t kernel_offset = 0, kernel_bytes = 0;
};
WorkspaceLayout workspace_layout(const OpDef& def, const KernelChoice& k, const std::vector<TensorType>& in,
                                 const std::vector<TensorType>& out, const Attrs& attrs);

// The kernel's KernelDef::host_buffers for a node of these types (the f32 types a widened kernel sees).
std::vector<std::pair<std::string, size_t>> host_buffers(const KernelChoice& k,
                                                         const std::vector<TensorType>& in,
                                                         const std::vector<TensorType>& out,
                                                         const Attrs& attrs);

// f16 and bf16: the storage types that widened kernels and the mixed-precision pass deal in.
inline bool is_low_precision(DType t) {
  return t == DType::f16 || t == DType::bf16;
}

class OpRegistry {
 public:
  static OpRegistry& get();  // filled on first use by register_all_ops (no static initialisers)
  void add(OpDef def);
  // A kernel for another device, added to an op already registered (the CUDA backend's, ops/cuda/).
  void add_kernel(const std::string& op, KernelDef k);
  const OpDef& at(const std::string& name) const;  // throws input_error with a "did you mean"
  const OpDef* find(const std::string& name) const;
  const std::map<std::string, OpDef>& all() const { return ops_; }

 private:
  std::map<std::string, OpDef> ops_;
};

// Output type of most unary/elementwise ops: same as input 0.
std::vector<TensorType> same_as_input0(const std::vector<TensorType>& in, const Attrs&);

// Closest string by edit distance, for "did you mean" messages ("" if nothing is close).
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace flowrun
