// Human-readable listing of the op registry (for `flowrun ops`).
#pragma once

#include <string>

namespace flowrun {

// One line per op: name, which devices/dtypes have kernels, differentiable or not, and its doc.
// `filter` keeps ops whose name contains it.
std::string list_ops(const std::string& filter = "");

}  // namespace flowrun
