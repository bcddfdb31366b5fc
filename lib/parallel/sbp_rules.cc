// Signatures shared by many ops (see parallel/sbp_rules.h).
#include "parallel/sbp_rules.h"

#include <algorithm>

namespace flowrun {

const char* mesh_axis_name(MeshAxis a) {
  return a == MeshAxis::data ? "data" : "tensor";
}

namespace {

int rank_of(const TensorType& t) {
  return static_cast<int>(t.shape.size());
}

// The split SBPs among the inputs' current ones (candidates for ops that keep an axis split).
std::vector<Sbp> current_splits(const SbpQuery& q) {
  std::vector<Sbp> s;
  for (const auto& c : q.cur)
    if (c && c->kind == Sbp::S && std::find(s.begin(), s.end(), *c) == s.end()) s.push_back(*c);
  return s;
}

}  // namespace

std::vector<SbpSignature> elementwise_signatures(const SbpQuery& q, bool linear_in_p) {
  std::vector<SbpSignature> sigs;
  const int ro = rank_of(q.out[0]);
  for (const Sbp& s : current_splits(q)) {
    // The candidate's output axis: from whichever input carries this split.
    int axis = -1;
    for (size_t i = 0; i < q.in.size() && axis < 0; ++i)
      if (q.cur[i] && *q.cur[i] == s) axis = s.axis + ro - rank_of(q.in[i]);
    SbpSignature sig;
    for (const TensorType& t : q.in) {
      const int a = axis - (ro - rank_of(t));
      const bool broadcast = a < 0 || t.shape[static_cast<size_t>(a)] == 1;
      sig.in.push_back(broadcast ? Sbp::broadcast() : Sbp::split(a, s.groups));
    }
    for (size_t o = 0; o < q.out.size(); ++o) sig.out.push_back(Sbp::split(axis, s.groups));
    sigs.push_back(sig);
  }
  if (linear_in_p) {
    bool any_p = false;
    for (const auto& c : q.cur) any_p = any_p || (c && c->kind == Sbp::P);
    if (any_p)
      sigs.push_back(
          {std::vector<Sbp>(q.in.size(), Sbp::partial()), std::vector<Sbp>(q.out.size(), Sbp::partial())});
  }
  return sigs;
}

std::vector<SbpSignature> row_wise_signatures(const SbpQuery& q, size_t split_inputs) {
  std::vector<SbpSignature> sigs;
  // Partial sums in (a vocabulary-parallel embedding's output read by Llama's first RMSNorm) are reduced to
  // B, not reduce-scattered into a split of the batch or sequence: that split, cheaper here, would make
  // every later linear run on replicated weights (the deduction is greedy and never returns to B), and lose
  // Megatron's column- and row-parallel layout.
  if (q.axis == MeshAxis::tensor && q.cur[0] && q.cur[0]->kind == Sbp::P) return sigs;
  for (int a = 0; a + 1 < rank_of(q.in[0]); ++a) {
    SbpSignature s;
    for (size_t i = 0; i < q.in.size(); ++i)
      s.in.push_back(i < split_inputs ? Sbp::split(a) : Sbp::broadcast());
    for (const TensorType& t : q.out) s.out.push_back(a < rank_of(t) ? Sbp::split(a) : Sbp::broadcast());
    sigs.push_back(s);
  }
  return sigs;
}

std::vector<SbpSignature> without_grouped_outputs(std::vector<SbpSignature> s) {
  s.erase(std::remove_if(s.begin(), s.end(),
                         [](const SbpSignature& g) {
                           return !g.out.empty() && g.out[0].kind == Sbp::S && g.out[0].groups > 1;
                         }),
          s.end());
  return s;
}

}  // namespace flowrun
