// Shape ops: reshape (more layout ops join this file).
#include "graph/builder.h"
#include "ops/cpu/elementwise.h"
#include "ops/registry.h"

namespace flowrun {

namespace {
const std::vector<DType> kAnyFloat = {DType::f32, DType::f64, DType::f16, DType::bf16};

Cost copy_cost(const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
  return {0, 2.0 * static_cast<double>(numel(in[0].shape)) * static_cast<double>(dtype_size(in[0].dtype))};
}
}  // namespace

void register_shape_ops(OpRegistry& r) {
  OpDef d;
  d.name = "reshape";
  d.doc = "same elements, new shape (one dimension may be -1); shares its input's memory when planned in place";
  d.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    Shape s = a.ints("shape");
    int64_t known = 1, infer_at = -1;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == -1) {
        if (infer_at >= 0) throw input_error("reshape: more than one -1");
        infer_at = static_cast<int64_t>(i);
      } else {
        known *= s[i];
      }
    }
    const int64_t n = numel(in[0].shape);
    if (infer_at >= 0 && known > 0 && n % known == 0) s[static_cast<size_t>(infer_at)] = n / known;
    if (numel(s) != n) throw input_error(cat("reshape: cannot view ", shape_str(in[0].shape), " as ", shape_str(a.ints("shape"))));
    return {{s, in[0].dtype}};
  };
  d.grad = [](GradCtx& c) -> std::vector<ValueId> { return {c.b.reshape(c.dout(0), c.b.shape(c.in(0)))}; };
  d.cost = copy_cost;
  d.inplace_input = 0;
  d.kernels = {{DeviceKind::cpu, kAnyFloat, cpu::copy}};
  d.samples = [] {
    OpSample a, b;
    a.label = "[3,4]->[2,6]";
    a.inputs = {{{3, 4}, DType::f64}};
    a.attrs = Attrs{{"shape", Shape{2, 6}}};
    b.label = "[2,3,4]->[-1,4]";
    b.inputs = {{{2, 3, 4}, DType::f64}};
    b.attrs = Attrs{{"shape", Shape{-1, 4}}};
    return std::vector<OpSample>{a, b};
  };
  r.add(d);
}

}  // namespace flowrun
