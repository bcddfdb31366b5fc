// SBP values: text form, local shapes, and cutting whole tensors into ranks' pieces and back.
#include "parallel/sbp.h"

#include <cstring>

#include "core/error.h"

namespace flowrun {

std::string Sbp::str() const {
  if (kind == B) return "B";
  if (kind == P) return "P";
  return groups > 1 ? cat("S(", axis, ")x", groups) : cat("S(", axis, ")");
}

Sbp parse_sbp(const std::string& text, size_t rank, const std::string& what) {
  if (text == "B") return Sbp::broadcast();
  if (text == "P") return Sbp::partial();
  long axis = 0, groups = 1;
  char close = 0, x = 0;
  int used = 0;
  const int got = std::sscanf(text.c_str(), "S(%ld%c%n", &axis, &close, &used);
  bool ok = got == 2 && close == ')';
  if (ok && static_cast<size_t>(used) < text.size()) {
    int more = 0;
    ok = std::sscanf(text.c_str() + used, "%c%ld%n", &x, &groups, &more) == 2 && x == 'x' && groups >= 1 &&
         static_cast<size_t>(used + more) == text.size();
  }
  const long r = static_cast<long>(rank);
  if (ok && axis < 0) axis += r;
  if (!ok || axis < 0 || axis >= r)
    throw input_error(cat(what, ": expected B, S(axis) or S(axis)xGROUPS with an axis of a ", rank,
                          "-d tensor, got '", text, "'"));
  return Sbp::split(static_cast<int>(axis), static_cast<int>(groups));
}

bool splittable(const Shape& shape, const Sbp& s, int64_t parts) {
  if (s.kind != Sbp::S) return true;
  if (s.axis < 0 || static_cast<size_t>(s.axis) >= shape.size()) return false;
  return shape[static_cast<size_t>(s.axis)] % (parts * s.groups) == 0;
}

Shape local_shape(const Shape& whole, const Sbp& s, int64_t parts) {
  FR_CHECK(splittable(whole, s, parts), "shape ", shape_str(whole), " cannot be split ", s.str(), " over ",
           parts);
  Shape out = whole;
  if (s.kind == Sbp::S) out[static_cast<size_t>(s.axis)] /= parts;
  return out;
}

SplitView split_view(const Shape& whole, const Sbp& s, int64_t parts) {
  FR_CHECK(s.kind == Sbp::S && splittable(whole, s, parts), "split_view of ", s.str(), shape_str(whole));
  SplitView v;
  const size_t a = static_cast<size_t>(s.axis);
  for (size_t i = 0; i < a; ++i) v.outer *= whole[i];
  v.outer *= s.groups;
  int64_t inner = 1;
  for (size_t i = a + 1; i < whole.size(); ++i) inner *= whole[i];
  v.chunk = whole[a] / (parts * s.groups) * inner;
  return v;
}

Tensor take_part(const Tensor& whole, const Sbp& s, int64_t part, int64_t parts) {
  if (s.kind != Sbp::S) return whole.clone();
  Tensor piece = Tensor::empty(local_shape(whole.shape(), s, parts), whole.dtype());
  const SplitView v = split_view(whole.shape(), s, parts);
  const size_t row = static_cast<size_t>(v.chunk) * dtype_size(whole.dtype());
  const char* src = static_cast<const char*>(whole.raw());
  char* dst = static_cast<char*>(piece.raw());
  for (int64_t o = 0; o < v.outer; ++o)
    std::memcpy(dst + static_cast<size_t>(o) * row, src + static_cast<size_t>(o * parts + part) * row, row);
  return piece;
}

void put_part(Tensor& whole, const Tensor& piece, const Sbp& s, int64_t part, int64_t parts) {
  if (s.kind != Sbp::S) {
    std::memcpy(whole.raw(), piece.raw(), whole.nbytes());
    return;
  }
  const SplitView v = split_view(whole.shape(), s, parts);
  const size_t row = static_cast<size_t>(v.chunk) * dtype_size(whole.dtype());
  const char* src = static_cast<const char*>(piece.raw());
  char* dst = static_cast<char*>(whole.raw());
  for (int64_t o = 0; o < v.outer; ++o)
    std::memcpy(dst + static_cast<size_t>(o * parts + part) * row, src + static_cast<size_t>(o) * row, row);
}

}  // namespace flowrun
