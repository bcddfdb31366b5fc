// Optimizer update ops: they mutate parameters and optimizer state in place, and run after every reader of
// the old values (see Graph::live_nodes_topological).
#include "ops/cpu/optim.h"
#include "ops/registry.h"

namespace flowrun {

void register_optim_ops(OpRegistry& r) {
  OpDef d;
  d.name = "sgd_update";
  d.doc = "p -= lr * (momentum/Nesterov of grad + weight_decay * p), PyTorch's SGD (buffer starts at zero); "
          "inputs (param, grad, momentum buffer, lr scalar)";
  d.num_inputs = 4;
  d.num_outputs = [](const Attrs&) { return 0; };
  d.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    if (in[0].shape != in[1].shape) throw input_error("sgd_update: gradient shape differs from the parameter");
    if (a.f("momentum", 0) != 0 && in[2].shape != in[0].shape) throw input_error("sgd_update: momentum buffer shape");
    if (numel(in[3].shape) != 1) throw input_error("sgd_update: lr must be a scalar");
    return {};
  };
  d.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
    const double n = static_cast<double>(numel(in[0].shape));
    return Cost{4 * n, 5 * n * static_cast<double>(dtype_size(in[0].dtype))};
  };
  d.nondiff_inputs = {0, 1, 2, 3};
  d.mutates = {0, 2};
  d.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64}, cpu::sgd_update}};
  d.samples = [] {
    std::vector<OpSample> s;
    for (bool nesterov : {false, true}) {
      OpSample o;
      o.label = nesterov ? "nesterov" : "momentum";
      o.inputs = {{{7}, DType::f64}, {{7}, DType::f64}, {{7}, DType::f64}, {{}, DType::f64}};
      o.attrs = Attrs{{"momentum", 0.9}, {"dampening", 0.1}, {"nesterov", nesterov}, {"weight_decay", 0.01}};
      o.reference = [](const std::vector<Tensor>& in, const Attrs& a) {
        Tensor p = in[0].clone(), buf = in[2].clone();
        const double lr = in[3].data<double>()[0], mom = a.f("momentum"), damp = a.f("dampening"),
                     wd = a.f("weight_decay");
        for (int64_t i = 0; i < p.numel(); ++i) {
          double g = in[1].data<double>()[i] + wd * p.data<double>()[i];
          double& b = buf.data<double>()[i];
          b = mom * b + (1 - damp) * g;
          g = a.b("nesterov") ? g + mom * b : b;
          p.data<double>()[i] -= lr * g;
        }
        return std::vector<Tensor>{p, buf};  // the mutated inputs, in order
      };
      s.push_back(o);
    }
    return s;
  };
  r.add(d);
}

}  // namespace flowrun
