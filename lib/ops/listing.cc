// `flowrun ops`: the registry as a table.
#include "ops/listing.h"

#include <algorithm>
#include <sstream>

#include "core/cuda_backend.h"
#include "ops/registry.h"

namespace flowrun {

namespace {
// Left-justified in a column of `width` (at least one space after).
std::string pad(std::string s, size_t width) {
  s.resize(std::max(width, s.size() + 1), ' ');
  return s;
}
}  // namespace

std::string list_ops(const std::string& filter) {
  // The CUDA kernels are listed when the backend can be opened (it is, for this listing only).
  std::string no_cuda;
  cuda::load_backend(&no_cuda);
  std::ostringstream os;
  size_t width = 4;
  for (const auto& [name, def] : OpRegistry::get().all()) width = std::max(width, name.size() + 2);
  os << pad("op", width) << pad("kernels", 46) << pad("grad", 10) << "doc\n";
  int count = 0;
  for (const auto& [name, def] : OpRegistry::get().all()) {
    if (!filter.empty() && name.find(filter) == std::string::npos) continue;
    std::ostringstream kernels;
    for (size_t k = 0; k < def.kernels.size(); ++k) {
      kernels << (k ? " " : "") << device_kind_name(def.kernels[k].device) << ":";
      for (size_t i = 0; i < def.kernels[k].dtypes.size(); ++i)
        kernels << (i ? "," : "") << dtype_name(def.kernels[k].dtypes[i]);
    }
    // Low-precision dtypes served by the f32 kernel between conversions (see select_kernel).
    std::string widened;
    for (DType t : {DType::f16, DType::bf16})
      if (select_kernel(def, DeviceKind::cpu, t).widened) widened += cat(widened.empty() ? "" : ",", dtype_name(t));
    if (!widened.empty()) kernels << " widened:" << widened;
    // "backward": a helper used only inside gradients; "update": an optimizer step that mutates state;
    // "no": not differentiable (optimizer arithmetic such as norms of gradients).
    const bool helper = name.size() > 5 && name.compare(name.size() - 5, 5, "_grad") == 0;
    const char* grad = def.grad ? "yes" : def.updates_in_place() ? "update" : helper ? "backward" : "no";
    os << pad(name, width) << pad(kernels.str(), 46) << pad(grad, 10) << def.doc << "\n";
    ++count;
  }
  os << count << " ops\n";
  if (!no_cuda.empty()) os << "no CUDA kernels listed: " << no_cuda << "\n";
  return os.str();
}

}  // namespace flowrun
