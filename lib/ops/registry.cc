// The op registry and its explicit fill (see all_ops.h: no static initialisers, so the linker keeps every
// op).
#include "ops/registry.h"

#include <algorithm>

#include "graph/builder.h"
#include "ops/all_ops.h"

namespace flowrun {

const KernelDef* OpDef::kernel(DeviceKind d, DType t) const {
  for (const auto& k : kernels)
    if (k.device == d && std::find(k.dtypes.begin(), k.dtypes.end(), t) != k.dtypes.end() &&
        (!k.available || k.available()))
      return &k;
  return nullptr;
}

DType result_dtype(DType operands, const Attrs& a) {
  if (!a.has("out_dtype")) return operands;
  if (!a.is("out_dtype", "f32") || !is_low_precision(operands))
    throw input_error(cat("out_dtype ", a.s("out_dtype"), " on ", dtype_name(operands),
                          " operands: only f32, from f16 or bf16"));
  return DType::f32;
}

KernelChoice select_kernel(const OpDef& def, DeviceKind d, DType t) {
  if (const KernelDef* k = def.kernel(d, t)) return {k, false};
  if (is_low_precision(t) && !def.updates_in_place())
    if (const KernelDef* k = def.kernel(d, DType::f32)) return {k, true};
  return {};
}

WorkspaceLayout workspace_layout(const OpDef& def, const KernelChoice& k, const std::vector<TensorType>& in,
                                 const std::vector<TensorType>& out, const Attrs& attrs) {
  const bool widened = k.widened;
  WorkspaceLayout w;
  auto align = [](size_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; };
  std::vector<TensorType> kin = in, kout = out;
  auto widen = [&](std::vector<TensorType>& types, std::vector<int64_t>& offsets) {
    for (TensorType& t : types) {
      offsets.push_back(-1);
      if (!widened || !is_low_precision(t.dtype)) continue;
      offsets.back() = static_cast<int64_t>(w.bytes);
      t.dtype = DType::f32;
      w.bytes += align(static_cast<size_t>(numel(t.shape)) * sizeof(float));
    }
  };
  widen(kin, w.in_offset);
  widen(kout, w.out_offset);
  w.kernel_offset = w.bytes;
  const auto& size = k.kernel && k.kernel->workspace ? k.kernel->workspace : def.workspace;
  w.kernel_bytes = size ? size(kin, kout, attrs) : 0;
  w.bytes += w.kernel_bytes;
  return w;
}

std::vector<std::pair<std::string, size_t>> host_buffers(const KernelChoice& k,
                                                         const std::vector<TensorType>& in,
                                                         const std::vector<TensorType>& out,
                                                         const Attrs& attrs) {
  if (!k.kernel || !k.kernel->host_buffers) return {};
  std::vector<TensorType> kin = in, kout = out;
  for (auto* types : {&kin, &kout})
    for (TensorType& t : *types)
      if (k.widened && is_low_precision(t.dtype)) t.dtype = DType::f32;
  return k.kernel->host_buffers(kin, kout, attrs);
}

ValueId GradCtx::dout(int i) const {
  const ValueId g = out_grads.at(static_cast<size_t>(i));
  return g != kNoValue ? g : b.zeros_like(out(i));
}

OpRegistry& OpRegistry::get() {
  static OpRegistry* reg = [] {
    auto* r = new OpRegistry();
    register_all_ops(*r);
    return r;
  }();
  return *reg;
}

void OpRegistry::add(OpDef def) {
  FR_CHECK(!ops_.count(def.name), "op ", def.name, " registered twice");
  FR_CHECK(static_cast<bool>(def.infer), "op ", def.name, " has no shape inference");
  ops_.emplace(def.name, std::move(def));
}

void OpRegistry::add_kernel(const std::string& op, KernelDef k) {
  auto it = ops_.find(op);
  FR_CHECK(it != ops_.end(), "a kernel for op ", op, ", which is not registered");
  it->second.kernels.push_back(std::move(k));
}

const OpDef* OpRegistry::find(const std::string& name) const {
  auto it = ops_.find(name);
  return it == ops_.end() ? nullptr : &it->second;
}

const OpDef& OpRegistry::at(const std::string& name) const {
  if (const OpDef* d = find(name)) return *d;
  std::vector<std::string> names;
  for (const auto& [n, _] : ops_) names.push_back(n);
  const std::string near = closest_match(name, names);
  throw input_error(cat("unknown op '", name, "'", near.empty() ? "" : cat(" (did you mean '", near, "'?)")));
}

std::vector<TensorType> same_as_input0(const std::vector<TensorType>& in, const Attrs&) {
  return {in.at(0)};
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  auto dist = [](const std::string& a, const std::string& b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= b.size(); ++j)
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      std::swap(prev, cur);
    }
    return prev[b.size()];
  };
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    const size_t d = dist(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

std::function<void(int, Tensor&, uint64_t)> sample_fill(std::map<int, double> constants,
                                                        int nonnegative_begin, int nonnegative_end) {
  return [constants, nonnegative_begin, nonnegative_end](int i, Tensor& t, uint64_t seed) {
    const bool nonnegative = i >= nonnegative_begin && i < nonnegative_end;
    const RngStream r{seed, 300 + static_cast<uint64_t>(i)};
    std::vector<double> v(static_cast<size_t>(t.numel()));
    for (size_t k = 0; k < v.size(); ++k) {
      if (auto it = constants.find(i); it != constants.end())
        v[k] = it->second;
      else
        v[k] = nonnegative ? r.uniform(k) : 2.0 * r.uniform(k) - 1.0;
    }
    t.fill_from(v);
  };
}

}  // namespace flowrun
