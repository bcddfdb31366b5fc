// CPU kernels of the layout ops (ops/shape.cc): transpose, permute, slice, slice_at, concat, split and
// slice_grad.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "ops/registry.h"

namespace flowrun::cpu {

// Permute and transpose index with fixed-size arrays so that kernels never allocate: rank is capped here.
inline constexpr int kMaxLayoutRank = 8;

// Python slice bounds (step 1) for an axis of length n: negatives count from the end, then both clamp to
// [0, n] and an inverted range is empty. Shared by shape inference and the kernels so they always agree.
inline std::pair<int64_t, int64_t> resolve_slice(int64_t start, int64_t end, int64_t n) {
  auto fix = [n](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + n : v, 0, n); };
  const int64_t s = fix(start);
  return {s, std::max(s, fix(end))};
}

// These copy bytes, so one kernel serves every dtype.
void transpose(const KernelCtx& c);
void permute(const KernelCtx& c);
void slice(const KernelCtx& c);
void slice_grad(const KernelCtx& c);
// x[start : start + length] along axis, start read from input 1 (i64) at run time.
void slice_at(const KernelCtx& c);
void concat(const KernelCtx& c);
void split(const KernelCtx& c);

}  // namespace flowrun::cpu
