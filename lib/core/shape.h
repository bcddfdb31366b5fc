// Shapes: dimension lists, element counts and NumPy-style broadcasting.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace flowrun {

using Shape = std::vector<int64_t>;

int64_t numel(const Shape& s);
std::string shape_str(const Shape& s);
// Broadcast two shapes NumPy-style (right-aligned; a dimension of 1 stretches); nullopt if incompatible.
std::optional<Shape> broadcast_shapes(const Shape& a, const Shape& b);
// Normalise a possibly negative axis for a tensor of the given rank; throws if out of range.
int normalize_axis(int64_t axis, size_t rank);
// Row-major strides in elements.
std::vector<int64_t> contiguous_strides(const Shape& s);

}  // namespace flowrun
