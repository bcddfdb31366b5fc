// oneDNN bf16 matmul. Primitives are created on first use of a shape and cached, so the steady-state step
// only rebinds data handles.
#include "ops/cpu/dnnl_matmul.h"

#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>

namespace flowrun::cpu {

namespace {

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, bool, bool>;

struct Cached {
  dnnl::matmul prim;
  dnnl::memory a, b, y;
  std::unordered_map<int, dnnl::memory> args;  // built once: execute() then allocates nothing
};

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::memory::desc desc(int64_t batch, int64_t rows, int64_t cols, bool trans, bool shared) {
  using dt = dnnl::memory::data_type;
  // Logical (batch, rows, cols); a transposed operand is stored (cols, rows); a shared one has batch stride 0.
  const dnnl::memory::dims dims = {batch, rows, cols};
  // A zero batch stride only where it matters (batch > 1): oneDNN falls back to its slow reference kernel
  // for a zero stride even on a single matrix.
  const dnnl::memory::dims strides = {shared && batch > 1 ? 0 : rows * cols, trans ? 1 : cols, trans ? rows : 1};
  return dnnl::memory::desc(dims, dt::bf16, strides);
}

}  // namespace

void dnnl_matmul_bf16(int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb, int64_t a_stride,
                      int64_t b_stride, const void* a, const void* b, void* y) {
  static std::map<Key, Cached> cache;
  static std::mutex mu;
  const Key key{batch, m, n, k, ta, tb, a_stride == 0, b_stride == 0};
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) {
    const auto ad = desc(batch, m, k, ta, a_stride == 0);
    const auto bd = desc(batch, k, n, tb, b_stride == 0);
    const auto yd = desc(batch, m, n, false, false);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, bd, yd), engine());
    Cached c{dnnl::matmul(pd), dnnl::memory(ad, engine(), nullptr), dnnl::memory(bd, engine(), nullptr),
             dnnl::memory(yd, engine(), nullptr), {}};
    c.args = {{DNNL_ARG_SRC, c.a}, {DNNL_ARG_WEIGHTS, c.b}, {DNNL_ARG_DST, c.y}};
    it = cache.emplace(key, std::move(c)).first;
  }
  Cached& c = it->second;
  c.a.set_data_handle(const_cast<void*>(a));
  c.b.set_data_handle(const_cast<void*>(b));
  c.y.set_data_handle(y);
  static dnnl::stream stream(engine());
  c.prim.execute(stream, c.args);
  stream.wait();
}

}  // namespace flowrun::cpu
