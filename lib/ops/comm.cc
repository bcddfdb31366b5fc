// Collective ops, inserted by the parallel passes (never written in a model): all_reduce sums a bucket of
// tensors over the ranks of the data axis in one transfer; local_shard and all_gather_into split a tensor
// into per-rank flat shards and put it back together (ZeRO); the sbp_* ops box values on a mesh axis.
#include "ops/cpu/comm.h"

#include <cstring>

#include "graph/builder.h"
#include "ops/registry.h"
#include "parallel/comm.h"

namespace flowrun {

namespace {

double bytes_of(const std::vector<TensorType>& ts) {
  double b = 0;
  for (const TensorType& t : ts)
    b += static_cast<double>(numel(t.shape) * static_cast<int64_t>(dtype_size(t.dtype)));
  return b;
}

// On another mesh axis a boxing op is linear (partial sums pass) and leaves splits of the other tensor axes
// alone.
std::vector<SbpSignature> boxing_passes(const SbpQuery& q) {
  std::vector<SbpSignature> sigs;
  if (!q.cur[0]) return sigs;
  const Sbp s = *q.cur[0];
  const bool moves_axis = q.attrs.has("axis");
  if (s.kind == Sbp::P || (s.kind == Sbp::S && (!moves_axis || s.axis != q.attrs.i("axis"))))
    sigs.push_back({{s}, {s}});
  return sigs;
}

// The boxing ops of a mesh axis (graph/sbp_parallel.cc), each the other's gradient: attrs mesh ("data" or
// "tensor"), parts (the axis's ranks) and, for the split ones, axis and groups (an S(axis)xgroups split,
// parallel/sbp.h).
void register_boxing_ops(OpRegistry& r) {
  auto attrs_of = [](const Node& n) { return n.attrs; };
  auto split_shape = [](const TensorType& t, const Attrs& a, bool gather) -> TensorType {
    const int64_t parts = a.i("parts"), axis = a.i("axis"), groups = a.i("groups", 1);
    if (parts < 1 || groups < 1 || axis < 0 || axis >= static_cast<int64_t>(t.shape.size()))
      throw input_error(cat("boxing op: bad parts ", parts, ", axis ", axis, " or groups ", groups, " for ",
                            shape_str(t.shape)));
    TensorType out = t;
    int64_t& d = out.shape[static_cast<size_t>(axis)];
    if (gather) {
      if (d % groups != 0) throw input_error(cat("boxing gather: axis ", axis, " not divisible by groups"));
      d *= parts;
    } else {
      if (d % (parts * groups) != 0)
        throw input_error(cat("boxing split: ", shape_str(t.shape), " axis ", axis, " is not divisible by ",
                              parts, " x ", groups));
      d /= parts;
    }
    return out;
  };
  auto sample = [](const std::string& label, Attrs a) {
    OpSample o;
    o.label = label;
    o.inputs = {{{2, 6}, DType::f64}};
    o.attrs = std::move(a);
    o.reference = [](const std::vector<Tensor>& in, const Attrs&) {
      return std::vector<Tensor>{in[0].clone()};
    };
    return o;
  };
  const Attrs one{{"parts", int64_t{1}}, {"mesh", std::string("tensor")}};
  const Attrs one_split{
      {"parts", int64_t{1}}, {"mesh", std::string("data")}, {"axis", int64_t{1}}, {"groups", int64_t{3}}};
  auto bytes = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
    return Cost{0, bytes_of(in) + bytes_of(out)};
  };

  OpDef ar;
  ar.name = "sbp_all_reduce";
  ar.doc = "P -> B on a mesh axis: the sum over its ranks (Megatron's g); gradient: the identity";
  ar.infer = same_as_input0;
  ar.cost = bytes;
  ar.sbp = boxing_passes;
  ar.grad = [](GradCtx& c) -> std::vector<ValueId> { return {c.dout(0)}; };
  ar.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64}, cpu::sbp_all_reduce}};
  ar.samples = [=] { return std::vector<OpSample>{sample("one rank", one)}; };
  r.add(ar);

  OpDef en;
  en.name = "sbp_enter";
  en.doc =
      "a B value read by ops split over a mesh axis: the identity, whose gradient (each rank's partial sum) "
      "is all-reduced (Megatron's f; a parameter's gradient under data parallelism)";
  en.infer = same_as_input0;
  en.cost = bytes;
  en.sbp = boxing_passes;
  en.grad = [attrs_of](GradCtx& c) -> std::vector<ValueId> {
    return {c.b.op1("sbp_all_reduce", {c.dout(0)}, attrs_of(c.node))};
  };
  en.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64}, cpu::sbp_copy}};
  en.samples = [=] { return std::vector<OpSample>{sample("one rank", one)}; };
  r.add(en);

  OpDef ag;
  ag.name = "sbp_all_gather";
  ag.doc = "S(axis) -> B on a mesh axis: every rank's block, in rank order; gradient: sbp_slice";
  ag.infer = [=](const std::vector<TensorType>& in, const Attrs& a) {
    return std::vector<TensorType>{split_shape(in[0], a, true)};
  };
  ag.cost = bytes;
  ag.sbp = boxing_passes;
  ag.workspace = [](const std::vector<TensorType>&, const std::vector<TensorType>& out, const Attrs&) {
    return static_cast<size_t>(bytes_of(out));
  };
  ag.grad = [attrs_of](GradCtx& c) -> std::vector<ValueId> {
    return {c.b.op1("sbp_slice", {c.dout(0)}, attrs_of(c.node))};
  };
  ag.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64, DType::i64, DType::u8}, cpu::sbp_all_gather}};
  ag.samples = [=] { return std::vector<OpSample>{sample("one rank", one_split)}; };
  r.add(ag);

  OpDef sl;
  sl.name = "sbp_slice";
  sl.doc = "B -> S(axis) on a mesh axis: this rank's block, no transfer; gradient: sbp_all_gather";
  sl.infer = [=](const std::vector<TensorType>& in, const Attrs& a) {
    return std::vector<TensorType>{split_shape(in[0], a, false)};
  };
  sl.cost = bytes;
  sl.sbp = boxing_passes;
  sl.grad = [attrs_of](GradCtx& c) -> std::vector<ValueId> {
    return {c.b.op1("sbp_all_gather", {c.dout(0)}, attrs_of(c.node))};
  };
  sl.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64, DType::i64, DType::u8}, cpu::sbp_slice}};
  sl.samples = [=] { return std::vector<OpSample>{sample("one rank", one_split)}; };
  r.add(sl);

  OpDef rs;
  rs.name = "sbp_reduce_scatter";
  rs.doc = "P -> S(axis) on a mesh axis: this rank's block of the sum; gradient: sbp_all_gather";
  rs.infer = sl.infer;
  rs.cost = bytes;
  rs.sbp = boxing_passes;
  rs.workspace = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
    return static_cast<size_t>(bytes_of(in));
  };
  rs.grad = [attrs_of](GradCtx& c) -> std::vector<ValueId> {
    return {c.b.op1("sbp_all_gather", {c.dout(0)}, attrs_of(c.node))};
  };
  rs.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64}, cpu::sbp_reduce_scatter}};
  rs.samples = [=] { return std::vector<OpSample>{sample("one rank", one_split)}; };
  r.add(rs);
}

}  // namespace

void register_comm_ops(OpRegistry& r) {
  OpDef d;
  d.name = "all_reduce";
  d.doc =
      "sum of each input over the ranks of the data axis (attr group \"ends\": the first and last pipeline "
      "stages), one transfer for the whole bucket, times attr scale (default 1); outputs one per input. In a "
      "one-process program it is the scaling alone";
  d.num_inputs = -1;
  d.num_outputs = [](const Attrs&) { return -1; };
  d.infer = [](const std::vector<TensorType>& in, const Attrs&) -> std::vector<TensorType> {
    for (const TensorType& t : in)
      if (t.dtype != in[0].dtype)
        throw input_error(cat("all_reduce: a bucket holds one dtype, got ", dtype_name(in[0].dtype), " and ",
                              dtype_name(t.dtype)));
    return in;
  };
  d.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
    Cost c;
    for (const TensorType& t : in) {
      c.flops += static_cast<double>(numel(t.shape));
      c.bytes += 2.0 * static_cast<double>(numel(t.shape)) * static_cast<double>(dtype_size(t.dtype));
    }
    return c;
  };
  // The bucket packed into one buffer.
  d.workspace = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
    size_t bytes = 0;
    for (const TensorType& t : in) bytes += static_cast<size_t>(numel(t.shape)) * dtype_size(t.dtype);
    return in.size() > 1 ? bytes : size_t{0};
  };
  d.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64}, cpu::all_reduce}};
  d.samples = [] {
    OpSample o;
    o.label = "bucket of two, scaled";
    o.inputs = {{{3, 4}, DType::f64}, {{5}, DType::f64}};
    o.attrs = Attrs{{"scale", 0.5}};
    o.gradcheck = false;
    o.reference = [](const std::vector<Tensor>& in, const Attrs& a) {
      std::vector<Tensor> out;
      for (const Tensor& t : in) {
        Tensor y = t.clone();
        for (int64_t i = 0; i < y.numel(); ++i) y.data<double>()[i] *= a.f("scale");
        out.push_back(y);
      }
      return out;
    };
    return std::vector<OpSample>{o};
  };
  r.add(d);

  OpDef ls;
  ls.name = "local_shard";
  ls.doc =
      "this rank's flat shard of x: elements [rank * s, (rank + 1) * s) of x flattened, s = ceil(numel / "
      "shards), zero-padded past the end; attr shards (the data-parallel ranks)";
  ls.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    const int64_t shards = a.i("shards");
    if (shards < 1) throw input_error("local_shard: shards must be >= 1");
    return {{{shard_size(numel(in[0].shape), shards)}, in[0].dtype}};
  };
  ls.cost = [](const std::vector<TensorType>&, const std::vector<TensorType>& out, const Attrs&) {
    return Cost{
        0, 2.0 * static_cast<double>(numel(out[0].shape) * static_cast<int64_t>(dtype_size(out[0].dtype)))};
  };
  ls.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64}, cpu::local_shard}};
  ls.samples = [] {
    OpSample o;
    o.label = "one shard";
    o.inputs = {{{3, 5}, DType::f64}};
    o.attrs = Attrs{{"shards", int64_t{1}}};
    o.gradcheck = false;
    o.reference = [](const std::vector<Tensor>& in, const Attrs&) {
      Tensor y = in[0].clone();
      return std::vector<Tensor>{y.reshape({15})};
    };
    return std::vector<OpSample>{o};
  };
  r.add(ls);

  OpDef ag;
  ag.name = "all_gather_into";
  ag.doc =
      "inputs (dst, shard): the shards of every rank, in rank order, written over dst (flattened, the "
      "padding dropped): the inverse of local_shard; attr shards";
  ag.num_inputs = 2;
  ag.num_outputs = [](const Attrs&) { return 0; };
  ag.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    const int64_t s = shard_size(numel(in[0].shape), a.i("shards"));
    if (in[1].shape != Shape{s} || in[1].dtype != in[0].dtype)
      throw input_error(cat("all_gather_into: the shard must be [", s, "] of ", dtype_name(in[0].dtype)));
    return {};
  };
  ag.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
    return Cost{
        0, 2.0 * static_cast<double>(numel(in[0].shape) * static_cast<int64_t>(dtype_size(in[0].dtype)))};
  };
  ag.workspace = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs& a) {
    return static_cast<size_t>(shard_size(numel(in[0].shape), a.i("shards")) * a.i("shards")) *
           dtype_size(in[0].dtype);
  };
  ag.nondiff_inputs = {0, 1};
  ag.mutates = {0};
  ag.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64}, cpu::all_gather_into}};
  ag.samples = [] {
    OpSample o;
    o.label = "one shard";
    o.inputs = {{{3, 5}, DType::f64}, {{15}, DType::f64}};
    o.attrs = Attrs{{"shards", int64_t{1}}};
    o.gradcheck = false;
    o.reference = [](const std::vector<Tensor>& in, const Attrs&) {
      return std::vector<Tensor>{in[1].clone().reshape({3, 5})};
    };
    return std::vector<OpSample>{o};
  };
  r.add(ag);

  // ZeRO-3's parameter: kept as this rank's flat shard, gathered whole where the step reads it.
  OpDef gs;
  gs.name = "gather_shards";
  gs.doc =
      "the whole tensor (attr shape) from every rank's flat shard, in rank order, the padding dropped: "
      "local_shard's inverse as a value; attr shards (the data-parallel ranks); its gradient is "
      "reduce_scatter_shard (each rank's shard of the gradient summed over the ranks)";
  gs.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    const Shape shape = a.ints("shape");
    const int64_t s = shard_size(numel(shape), a.i("shards"));
    if (in[0].shape != Shape{s})
      throw input_error(cat("gather_shards: the shard of ", shape_str(shape), " must be [", s, "], got ",
                            shape_str(in[0].shape)));
    return {{shape, in[0].dtype}};
  };
  gs.cost = [](const std::vector<TensorType>&, const std::vector<TensorType>& out, const Attrs&) {
    return Cost{
        0, 2.0 * static_cast<double>(numel(out[0].shape) * static_cast<int64_t>(dtype_size(out[0].dtype)))};
  };
  gs.workspace = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs& a) {
    return static_cast<size_t>(numel(in[0].shape) * a.i("shards")) * dtype_size(in[0].dtype);
  };
  gs.grad = [](GradCtx& c) -> std::vector<ValueId> {
    return {
        c.b.op1("reduce_scatter_shard", {c.dout(0)}, {{"shards", c.attrs().i("shards")}, {"scale", 1.0}})};
  };
  gs.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64}, cpu::gather_shards}};
  gs.samples = [] {
    OpSample o;
    o.label = "one shard";
    o.inputs = {{{15}, DType::f64}};
    o.attrs = Attrs{{"shards", int64_t{1}}, {"shape", std::vector<int64_t>{3, 5}}};
    o.reference = [](const std::vector<Tensor>& in, const Attrs&) {
      return std::vector<Tensor>{in[0].clone().reshape({3, 5})};
    };
    return std::vector<OpSample>{o};
  };
  r.add(gs);

  OpDef rs;
  rs.name = "reduce_scatter_shard";
  rs.doc =
      "ZeRO-2's gradient boxing P -> S: this rank's flat shard (as local_shard cuts it) of the sum of x over "
      "the data axis, times attr scale (default 1); attr shards (the data-parallel ranks)";
  rs.infer = ls.infer;
  rs.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
    return Cost{static_cast<double>(numel(in[0].shape)),
                static_cast<double>(numel(in[0].shape) * static_cast<int64_t>(dtype_size(in[0].dtype)))};
  };
  rs.workspace = ag.workspace;
  rs.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64}, cpu::reduce_scatter_shard}};
  rs.samples = [] {
    OpSample o;
    o.label = "one shard, scaled";
    o.inputs = {{{3, 5}, DType::f64}};
    o.attrs = Attrs{{"shards", int64_t{1}}, {"scale", 0.5}};
    o.gradcheck = false;
    o.reference = [](const std::vector<Tensor>& in, const Attrs&) {
      Tensor y = in[0].clone().reshape({15});
      for (int64_t i = 0; i < 15; ++i) y.data<double>()[i] *= 0.5;
      return std::vector<Tensor>{y};
    };
    return std::vector<OpSample>{o};
  };
  r.add(rs);

  // The gradient all-reduce split in two, so that the computation scheduled between them overlaps it.
  OpDef st;
  st.name = "all_reduce_start";
  st.doc =
      "starts the sum over the data axis of a bucket of tensors (one dtype): outputs the packed bucket, "
      "which "
      "the transfer owns until all_reduce_wait, and the transfer's handle (i64); scheduled as soon as its "
      "inputs "
      "are ready (eager)";
  st.num_inputs = -1;
  st.num_outputs = [](const Attrs&) { return 2; };
  st.infer = [](const std::vector<TensorType>& in, const Attrs&) -> std::vector<TensorType> {
    int64_t n = 0;
    for (const TensorType& t : in) {
      if (t.dtype != in[0].dtype) throw input_error("all_reduce_start: a bucket holds one dtype");
      n += numel(t.shape);
    }
    return {{{n}, in[0].dtype}, {{}, DType::i64}};
  };
  st.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
    return Cost{0, 2.0 * bytes_of(in)};
  };
  st.eager = true;
  st.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64}, cpu::all_reduce_start}};
  st.samples = [] {
    // One process, no communicator: the packed bucket and no transfer in flight (handle -1).
    OpSample o;
    o.label = "bucket of 2 x 3 and 4";
    o.inputs = {{{2, 3}, DType::f64}, {{4}, DType::f64}};
    o.gradcheck = false;
    o.reference = [](const std::vector<Tensor>& in, const Attrs&) {
      Tensor bucket = Tensor::empty({10}, DType::f64);
      std::memcpy(bucket.raw(), in[0].raw(), in[0].nbytes());
      std::memcpy(static_cast<char*>(bucket.raw()) + in[0].nbytes(), in[1].raw(), in[1].nbytes());
      return std::vector<Tensor>{bucket, Tensor::from<int64_t>({}, {-1})};
    };
    return std::vector<OpSample>{o};
  };
  r.add(st);

  OpDef wt;
  wt.name = "all_reduce_wait";
  wt.doc =
      "(bucket, handle) of all_reduce_start: waits for the sum and unpacks it, times attr scale (default 1), "
      "into tensors of the shapes attr dims lists (ranks: how many dims each has)";
  wt.num_inputs = 2;
  wt.num_outputs = [](const Attrs& a) { return static_cast<int>(a.ints_or_empty("ranks").size()); };
  wt.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    std::vector<TensorType> out;
    const auto& dims = a.ints("dims");
    size_t at = 0;
    int64_t n = 0;
    for (int64_t r : a.ints("ranks")) {
      if (r < 0 || at + static_cast<size_t>(r) > dims.size()) throw input_error("all_reduce_wait: bad dims");
      Shape s(dims.begin() + static_cast<std::ptrdiff_t>(at),
              dims.begin() + static_cast<std::ptrdiff_t>(at) + r);
      at += static_cast<size_t>(r);
      n += numel(s);
      out.push_back({s, in[0].dtype});
    }
    if (in[0].shape != Shape{n} || in[1].dtype != DType::i64)
      throw input_error(cat("all_reduce_wait: a bucket of ", n, " elements and an i64 handle expected"));
    return out;
  };
  wt.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
    return Cost{static_cast<double>(numel(in[0].shape)), 2.0 * bytes_of(in)};
  };
  wt.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64}, cpu::all_reduce_wait}};
  wt.samples = [] {
    // Start and wait in one process: the scaling alone, unpacked.
    OpSample o;
    o.label = "bucket of 2 x 3 and 4, halved";
    o.inputs = {{{10}, DType::f64}, {{}, DType::i64}};
    o.attrs =
        Attrs{{"ranks", std::vector<int64_t>{2, 1}}, {"dims", std::vector<int64_t>{2, 3, 4}}, {"scale", 0.5}};
    o.gradcheck = false;
    o.fill = [](int i, Tensor& t, uint64_t) {
      if (i == 1) {
        t.data<int64_t>()[0] = -1;  // no transfer in flight
        return;
      }
      for (int64_t j = 0; j < 10; ++j) t.data<double>()[j] = static_cast<double>(j);
    };
    o.reference = [](const std::vector<Tensor>&, const Attrs&) {
      Tensor a = Tensor::empty({2, 3}, DType::f64), b = Tensor::empty({4}, DType::f64);
      for (int64_t j = 0; j < 6; ++j) a.data<double>()[j] = 0.5 * static_cast<double>(j);
      for (int64_t j = 0; j < 4; ++j) b.data<double>()[j] = 0.5 * static_cast<double>(j + 6);
      return std::vector<Tensor>{a, b};
    };
    return std::vector<OpSample>{o};
  };
  r.add(wt);
  register_boxing_ops(r);
}

}  // namespace flowrun
