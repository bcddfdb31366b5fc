// SBP signatures: the ways an op can run over the ranks of one mesh axis, declared per op (OpDef::sbp) and
// chosen by the deduction in graph/sbp_parallel.cc.
#pragma once

#include <optional>
#include <vector>

#include "graph/ir.h"
#include "parallel/sbp.h"

namespace flowrun {

// One way an op can run over the ranks of a mesh axis: the SBP of each input it reads and of each output it
// writes. Ops declare theirs in OpDef::sbp; every op can also run replicated (all B), which is not listed.
struct SbpSignature {
  std::vector<Sbp> in, out;
  // linear (x S(last), W S(1), b): x W^T summed over the ranks, then b added once.
  bool row_bias = false;
  // Output 0 is this rank's mean over its part of a split axis (a loss): the whole mean is the sum of the
  // parts' means divided by the ranks, so it is a partial sum once scaled by 1 / ranks.
  bool partial_mean = false;
};

// What a signature rule sees of a node: its attributes, the whole (logical) types of its inputs and
// outputs, the SBP its inputs have now (nullopt: a parameter still free to take any), the block count each
// input is split in (Placement::groups), the axis and its number of ranks.
struct SbpQuery {
  const Attrs& attrs;
  std::vector<TensorType> in, out;
  std::vector<std::optional<Sbp>> cur;
  std::vector<int> groups;
  MeshAxis axis;
  int64_t parts;
};

// Signatures shared by many ops. Elementwise with NumPy broadcasting: an output axis split maps to the same
// axis of each input counted from the right, or B where that input broadcasts along it; with linear_in_p,
// partial sums in give partial sums out (add, sub, scaling). A split of a leading axis passed straight
// through ops that work along the last axis (norms, softmax): in and out S(a) for each a < rank - 1,
// the first `split_inputs` inputs split, the rest (weights) B, and every output split alike.
std::vector<SbpSignature> elementwise_signatures(const SbpQuery& q, bool linear_in_p);
std::vector<SbpSignature> row_wise_signatures(const SbpQuery& q, size_t split_inputs);
// Only the signatures whose outputs are not grouped splits (random ops: their numbers are drawn per element
// of the whole, which a grouped piece is not one box of).
std::vector<SbpSignature> without_grouped_outputs(std::vector<SbpSignature> s);

}  // namespace flowrun
