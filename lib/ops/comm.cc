// Collective ops, inserted by the parallel passes (never written in a model): all_reduce sums a bucket of
// tensors over the ranks of the world in one transfer.
#include "ops/cpu/comm.h"

#include "ops/registry.h"

namespace flowrun {

void register_comm_ops(OpRegistry& r) {
  OpDef d;
  d.name = "all_reduce";
  d.doc =
      "sum of each input over every rank (one transfer for the whole bucket), times attr scale (default 1); "
      "outputs one per input. In a one-process program it is the scaling alone";
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
}

}  // namespace flowrun
