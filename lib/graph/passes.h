// Graph passes and the one ordered pipeline that compiles a forward graph into a training (or inference)
// program: each pass is a named function over the Graph; compile() runs them in the order listed.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "graph/ir.h"
#include "graph/memplan.h"

namespace flowrun {

// What the optimizer pass appends. Graph inputs it uses: "lr" (f32 scalar, fed each step by the trainer
// from the schedule); "opt/step" (i64 scalar, 1-based count of updates: Adam's bias correction, SGD's first
// step); "opt/micro" (i64 scalar, index of the micro-batch within an accumulation window, when accumulation >
// 1). With clip_grad_norm > 0 it also outputs "grad_norm" (f32 scalar, the global L2 norm before clipping).
struct OptimizerSpec {
  std::string type = "none";  // none | sgd | adam | adamw
  double momentum = 0.0;      // sgd
  double dampening = 0.0;     // sgd
  bool nesterov = false;      // sgd
  double weight_decay = 0.0;  // sgd, adam: L2 term added to the gradient; adamw: decoupled
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam, adamw
  bool decay_1d = true;         // false: no weight decay on 1-d parameters (biases, norm scales)
  double clip_grad_norm = 0.0;  // > 0: every gradient is scaled by min(1, clip / (norm + 1e-6))
  // > 1: gradients are summed over this many micro-steps into state "opt/<param>/grad_acc"; the update
  // nodes carry Node::phase == 1 and run only when Executor::run(apply = true).
  int64_t accumulation = 1;
  // fp16 loss scaling: the backward pass starts from state "amp/loss_scale" (f32 scalar) instead of 1; the
  // updates apply 1/scale through their coefficient and skip a step whose gradients are not finite, and
  // loss_scale_update adapts the scale (states "amp/good_steps", "amp/skipped_steps", i64).
  // ZeRO-1 over this many data-parallel ranks (> 1): each rank keeps the optimizer state of, and updates,
  // one flat shard of every parameter ("local_shard"), then the shards are gathered back into the full
  // parameter ("all_gather_into"). State values carry Placement::global_shape.
  int64_t zero_shards = 1;
  // ZeRO-2: the gradients arrive as this rank's flat shards already (reduce_gradients' reduce-scatter), and
  // the gradient norm sums its squares over the data axis. ZeRO-3's parameters are such shards themselves
  // (Placement::sharded), updated where they are.
  bool sharded_grads = false;
  // A pipeline stage: the updates are apply-phase nodes even without accumulation (they run once every
  // micro-batch has gone through every stage), and the gradients of parameters several stages hold are
  // summed over them first (pipeline_shared_grads).
  bool pipeline = false;
  bool loss_scaling = false;
  bool dynamic_scale = true;  // false: a fixed scale (overflowing steps are still skipped and counted)
  int64_t growth_interval = 2000;
};

struct CompileOptions {
  std::string loss = "loss";  // name of the output to differentiate; empty = inference only
  OptimizerSpec optimizer;
  DType compute = DType::f32;  // f16 or bf16: the mixed-precision pass runs (see auto_mixed_precision)
  int64_t data_parallel = 1;   // ranks on the data axis; > 1 splits the batch over them (split_over_axis)
  int64_t data_rank = 0;
  int64_t zero = 0;                          // ZeRO stage (optimizer.zero_shards carries the shard count)
  int64_t bucket_bytes = int64_t{25} << 20;  // gradient all-reduce buckets (reduce_gradients)
  int64_t tensor_parallel = 1;  // ranks on the tensor axis; > 1 splits the model over them (split_over_axis)
  int64_t tensor_rank = 0;
  int64_t pipeline = 1;  // stages; > 1 keeps stage pipeline_stage of the model (pipeline_stage)
  int64_t pipeline_stage = 0;
  DeviceKind device = DeviceKind::cpu;
  bool fuse = true;
  bool inplace = true;
  // CPU: activations between convolutions stay in oneDNN's blocked layout (blocked_layout).
  bool blocked_layout = true;
  // That layout (nchw16c, nchw8c or nhwc); unset: the one this CPU's convolutions take (layout.cc).
  std::optional<Layout> blocked_as;
  // An eager program (`train.eager`): the graph as the model and autodiff wrote it, run node by node: no
  // fusion, no recompute, no in-place outputs, and no two values sharing memory (plan_memory's share).
  bool eager = false;
  // Multi-tensor updates (group_updates); unset: on the GPU only, where each update is a kernel launch (on
  // the CPU it was not measurably faster, lib/ops/cuda/README.md).
  std::optional<bool> group_updates;
  // Every parameter's gradient is a value of the step (--dump-step records them, --detect-anomaly checks
  // them): fuse_momentum_products, which computes some into the momentum buffer instead, is off.
  bool keep_gradients = false;
};

struct Pass {
  std::string name;
  std::function<void(Graph&, const CompileOptions&)> run;
};

// The pipeline, in order. Fusion runs before autodiff so that fused forward ops get their fused gradients.
std::vector<Pass> default_pipeline(const CompileOptions& opts);

void infer_shapes(Graph& g);  // re-run inference; checks recorded types
// log_softmax+nll_loss -> cross_entropy; for the GPU (device cuda) linear+gelu(tanh) -> linear with a fused
// GELU (activation: gelu).
void fuse_ops(Graph& g, DeviceKind device);
// On the CPU: reshape(transpose(sdpa(heads(q), heads(k), heads(v)), 1, 2)) with q, k, v the three parts of
// one split of qkv (B, T, 3 H D) and heads(x) = transpose(reshape(x, (B, T, H, D)), 1, 2) -> sdpa_qkv(qkv)
// (ops/attention.cc), when nothing else reads the values in between: no split, transposes or concat in the
// forward and backward passes, the same bits.
void fuse_packed_attention(Graph& g);
// On the CPU: the same with separate projections, heads(x) of each of q, k, v (B, L, H D) ->
// sdpa_rows(q, k, v [, key_ids]) on the rows in place.
void fuse_row_attention(Graph& g);
// After autodiff, on the CPU: relu_grad(maxpool2d_grad(dy, indices), y) -> maxpool2d_grad(dy, indices, y),
// one pass over the gradient instead of two; batchnorm_grad(relu_grad(dy, y), ...) -> batchnorm_grad(dy, ...,
// y); relu(batchnorm(x)) -> batchnorm(x) with attr relu where relu is the only reader.
void fuse_backward(Graph& g, DeviceKind device);
// On the CPU, after the precision passes: gelu_grad (or relu_grad) -> reduce_sum over every leading axis
// (keepdims: a linear's bias gradient) -> gelu_bias_grad (relu_bias_grad), which sums each row of the
// gradient while it is in cache, where the reduce_sum read the whole gradient back from memory; the same bits
// (ops/cpu/reduce.h). The reduce_sum's out_dtype (fold_f32_casts) carries over, hence the pass's place after
// that one.
void fuse_bias_gradients(Graph& g, DeviceKind device);
// On the CPU, after the optimizer: an f32 matmul (a weight's gradient, read by nothing else) feeding an
// sgd_update with momentum (no dampening, Nesterov or coef input) -> sgd_product_update, whose
// GEMM adds momentum * buf to the product and writes it into the momentum buffer (then the weight decay
// term): the gradient is neither written nor read back, 2.5-5.7% of the bench MLP's step. The same bits,
// where gemm_fuses_beta says the GEMM rounds each sum once as without beta. It runs where the product ran,
// once the weight's other readers have (Node::schedule_as), not with the other updates at the end.
void fuse_momentum_products(Graph& g, DeviceKind device);
// On the CPU, in mixed precision: a cast to bf16 that alone reads an f32 layernorm's or rmsnorm's y (the
// norm of the f32 residual stream, on its way into a bf16 GEMM) is folded into the norm, which rounds y to
// bf16 as it writes it (attribute out_dtype: bf16): one pass over y fewer and half its bytes, the same bits.
void fold_norm_casts(Graph& g, DeviceKind device);
// On the CPU, after autodiff: the add of a layernorm_grad's or rmsnorm_grad's f32 dx (read by nothing else)
// and the residual stream's gradient r goes into the norm gradient (attr residual: r an extra input, dx + r
// its output 0), and a cast of that output to bf16 becomes an extra output of it (attr dx_bf16): in a
// pre-norm transformer's backward each block's norms thus make the residual gradient and the bf16 copy its
// projections read, without an add and a cast reading the rows back. The same bits (the add's a + b and the
// cast's rounding, on the row in L1).
void fuse_norm_grad_residual(Graph& g, DeviceKind device);
// On the CPU: an f32 add of two same-shaped values (a residual stream's x + block output) whose sum a
// layernorm or rmsnorm normalises goes into that norm (attr residual: the addends as inputs 0 and last, the
// sum an extra output for its other readers), which adds each row and normalises it while it is in L1. The
// same bits (the add kernel's a + b).
void fuse_residual_norm(Graph& g, DeviceKind device);
// Appends the backward graph and fills param_grads; `seed` is the loss gradient to start from (default 1;
// the loss scale under fp16 loss scaling).
void autodiff(Graph& g, ValueId loss, ValueId seed = kNoValue);
// Activation recompute (after autodiff): the forward nodes of each segment (Node::segment) whose outputs the
// backward pass reads are emitted again, scheduled just before the first backward node that needs them, and
// the backward pass reads those copies; values that cross a segment's edge are kept (graph/recompute.cc).
void recompute_segments(Graph& g);
void add_optimizer(Graph& g, const OptimizerSpec& spec);  // appends update ops (and their state)
// Mixed precision. Each op has a policy: `low` ops (matmul, linear, conv2d, sdpa, sdpa_qkv) run in the low
// dtype, `f32` ops (softmax, losses, reductions) in f32, and the rest `follow` their inputs, promoting mixed
// f32/low inputs to f32. A `norm` op (batchnorm, layernorm, rmsnorm) keeps low-precision activations low and
// its parameters f32 where the device has such a kernel (KernelDef::f32_inputs), and is an `f32` op
// elsewhere. Casts go on
// boundary edges only, one per (value, dtype); parameters stay f32.
enum class AmpPolicy { low, f32, follow, norm };
AmpPolicy amp_policy(const std::string& op);
const char* amp_policy_name(AmpPolicy p);
void auto_mixed_precision(Graph& g, DType low, DeviceKind device);  // forward graph, before autodiff
// On the CPU, after autodiff: a cast to f32 that is the one reader of a low-precision matmul, linear or
// reduce_sum result (a weight or bias gradient on its way to the f32 master gradient, a projection's output
// on its way to the f32 residual stream) is folded into that op, which writes its f32 sum unrounded
// (attribute out_dtype: f32), one rounding and one pass over the result fewer. Eager programs fold alike:
// it is part of the precision policy, not an optional fusion.
void fold_f32_casts(Graph& g, DeviceKind device);
// Which ops run in which dtype, natively or widened (`flowrun check --plan`): one row per (op, dtype,
// kernel) with the op's policy and node count, the number of casts, and with every_node the whole schedule.
std::string describe_precision(const Graph& g, const std::vector<NodeId>& order, DeviceKind device,
                               bool every_node);
// Data or tensor parallelism over the `parts` ranks of one mesh axis (forward graph, before mixed precision
// and autodiff): SBP deduction from the ops' signatures and boxing, leaving rank `rank`'s local graph; values
// carry their SBP (and split parameters their whole shape) in Value::placement. The data axis runs first, on
// the graph of the global micro-batch (see graph/sbp_parallel.cc).
void split_over_axis(Graph& g, MeshAxis axis, int64_t parts, int64_t rank);
// After autodiff, on the data axis's `ranks`: the parameters' gradient all-reduces (the boxing of their
// partial sums) fused into buckets of about bucket_bytes, started as soon as their gradients exist and waited
// for before the optimizer; with shard_grads (ZeRO-2) a reduce-scatter of each instead, param_grads then
// holding this rank's flat shard of the summed gradient.
void reduce_gradients(Graph& g, int64_t ranks, bool shard_grads, int64_t bucket_bytes);
// ZeRO-3 over the data axis's `ranks` (forward graph, after the data and tensor axes' passes): every trained
// parameter becomes this rank's flat shard (Placement::global_shape: its local shape), and its data-axis
// entry (sbp_enter) a gather_shards, whose gradient is the reduce-scatter of the summed gradient into the
// shard. The backward pass gathers again (recompute_segments), so a whole parameter lives only around its
// uses.
void shard_parameters(Graph& g, int64_t ranks);
// Pipeline parallelism (forward graph, first of the parallel passes): keeps stage `stage` of `stages`, with
// the input "pp/in" and the output "pp/out" (see graph/pipeline.cc).
void pipeline_stage(Graph& g, int64_t stages, int64_t stage);
// In the optimizer's apply phase: the gradients of parameters several stages hold are summed over them
// (all_reduce over the mesh's `ends` group).
void pipeline_shared_grads(Graph& g, std::map<ValueId, ValueId>& grads);
// One line per parameter: name, whole shape, SBP on the tensor axis.
std::string describe_layout(const Graph& g);
// After the optimizer: the sgd_update/adamw_update nodes of one phase that share their attrs, dtype and
// scalar inputs (learning rate, step, coefficient) become one sgd_update_multi/adamw_update_multi node each
// (groups of one stay as they are).
void group_updates(Graph& g);
// CPU, after the optimizer: the (N, C, H, W) activations that convolutions make and the elementwise ops and
// batchnorms between them read are kept in the convolutions' blocked layout (Value::layout; `as`, or by
// default this CPU's: nChw16c, nChw8c or NHWC), with `reorder` nodes where another op reads one
// (graph/layout.cc).
void blocked_layout(Graph& g, std::optional<Layout> as = std::nullopt);
void eliminate_dead_nodes(Graph& g);                    // drops nodes no output or update needs
void check_kernels(const Graph& g, DeviceKind device);  // every live node has a kernel for its dtype

// The primary dtype used to pick a node's kernel: its first floating input, else input 0, else output 0.
DType kernel_dtype(const Graph& g, const Node& n);

// A compiled program: the rewritten graph, its schedule and memory plan.
struct Program {
  Graph graph;
  std::vector<NodeId> order;
  MemoryPlan memory;
  std::vector<std::string> pass_log;  // one line per pass: name, live nodes after it
  // A pipeline stage's order runs its forward nodes first: order[0, backward_begin) is the forward pass
  // (Executor::run_part), so that a stage can run the forward pass of one micro-batch and later its backward.
  size_t backward_begin = 0;
  bool eager = false;  // compiled with CompileOptions::eager: the executor checks and times every node
};

Program compile(Graph g, const CompileOptions& opts);

}  // namespace flowrun
