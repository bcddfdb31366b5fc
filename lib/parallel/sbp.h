// SBP on one mesh axis (the OneFlow model): a value is Split along a tensor axis over the axis's ranks,
// Broadcast (every rank holds all of it) or a Partial sum (the ranks' tensors add up to it). A split may be
// grouped: S(a)x3 views axis a as 3 equal blocks (a fused q|k|v projection) and splits each block, so that
// every rank holds its part of each block, contiguously.
#pragma once

#include <cstdint>
#include <string>

#include "core/shape.h"
#include "core/tensor.h"

namespace flowrun {

struct Sbp {
  enum Kind : uint8_t { B, S, P };
  Kind kind = B;
  int axis = 0;    // S only
  int groups = 1;  // S only
  static Sbp broadcast() { return {}; }
  static Sbp partial() { return {P, 0, 1}; }
  static Sbp split(int axis, int groups = 1) { return {S, axis, groups}; }
  bool operator==(const Sbp& o) const {
    return kind == o.kind && (kind != S || (axis == o.axis && groups == o.groups));
  }
  bool operator!=(const Sbp& o) const { return !(*this == o); }
  std::string str() const;  // "B", "P", "S(1)", "S(0)x3"
};

// The mesh axes a graph is split over by SBP deduction (graph/sbp_parallel.cc), in the order the passes run.
enum class MeshAxis : uint8_t { data, tensor };
const char* mesh_axis_name(MeshAxis a);  // "data", "tensor"

// "B", "P", "S(i)" or "S(i)xG" (i may be negative: from the last axis of a tensor of `rank` axes); an
// input_error naming `what` otherwise.
Sbp parse_sbp(const std::string& text, size_t rank, const std::string& what);

// Whether `shape` can be split by s over `parts` ranks (equal blocks; B and P always can).
bool splittable(const Shape& shape, const Sbp& s, int64_t parts);
// One rank's shape of a value whose whole shape is `whole`.
Shape local_shape(const Shape& whole, const Sbp& s, int64_t parts);

// The whole tensor viewed as [outer, parts, chunk] around a split axis (grouped splits fold the groups into
// outer): rank r's block is [outer, chunk] at r.
struct SplitView {
  int64_t outer = 1, chunk = 1;
};
SplitView split_view(const Shape& whole, const Sbp& s, int64_t parts);

// Rank `part`'s piece of a whole tensor (a copy; B: the whole tensor).
Tensor take_part(const Tensor& whole, const Sbp& s, int64_t part, int64_t parts);
// Writes rank `part`'s piece into the whole tensor.
void put_part(Tensor& whole, const Tensor& piece, const Sbp& s, int64_t part, int64_t parts);

}  // namespace flowrun
