// oneDNN matmul. Primitives are created on first use of a shape and cached together with their argument
// map and a user scratchpad, so the steady-state step only rebinds data handles and allocates nothing.
#include "ops/cpu/dnnl_matmul.h"

#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <vector>

#include "core/error.h"

namespace flowrun::cpu {

namespace {

using Key = std::tuple<DType, int64_t, int64_t, int64_t, int64_t, bool, bool, bool, bool, float, float>;

struct Cached {
  dnnl::matmul prim;
  dnnl::memory a, b, y, scratch;
  std::vector<dnnl_exec_arg_t> args;  // built once, for the C API (the C++ execute() builds a vector per call)
};

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::memory::desc desc(dnnl::memory::data_type t, int64_t batch, int64_t rows, int64_t cols, bool trans,
                        bool shared) {
  // Logical (batch, rows, cols); a transposed operand is stored (cols, rows); a shared one has batch stride 0.
  const dnnl::memory::dims dims = {batch, rows, cols};
  // A zero batch stride only where it matters (batch > 1): oneDNN falls back to its slow reference kernel
  // for a zero stride even on a single matrix.
  const dnnl::memory::dims strides = {shared && batch > 1 ? 0 : rows * cols, trans ? 1 : cols, trans ? rows : 1};
  return dnnl::memory::desc(dims, t, strides);
}

Cached make(const Key& key) {
  const auto [dtype, batch, m, n, k, ta, tb, a_shared, b_shared, alpha, beta] = key;
  const auto t = dtype == DType::bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
  const auto ad = desc(t, batch, m, k, ta, a_shared);
  const auto bd = desc(t, batch, k, n, tb, b_shared);
  const auto yd = desc(t, batch, m, n, false, false);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, bd, yd), attr, engine());
  Cached c{dnnl::matmul(pd), dnnl::memory(ad, engine(), nullptr), dnnl::memory(bd, engine(), nullptr),
           dnnl::memory(yd, engine(), nullptr), dnnl::memory(pd.scratchpad_desc(), engine()), {}};
  c.args = {{DNNL_ARG_SRC, c.a.get()}, {DNNL_ARG_WEIGHTS, c.b.get()}, {DNNL_ARG_DST, c.y.get()},
            {DNNL_ARG_SCRATCHPAD, c.scratch.get()}};
  return c;
}

}  // namespace

void dnnl_matmul(DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb, int64_t a_stride,
                 int64_t b_stride, float alpha, float beta, const void* a, const void* b, void* y) {
  FR_CHECK(dtype == DType::f32 || dtype == DType::bf16, "dnnl_matmul: unsupported dtype ", dtype_name(dtype));
  if (batch == 0 || m == 0 || n == 0) return;
  static std::map<Key, Cached> cache;
  static std::mutex mu;
  const Key key{dtype, batch, m, n, k, ta, tb, a_stride == 0, b_stride == 0, alpha, beta};
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make(key)).first;
  Cached& c = it->second;
  c.a.set_data_handle(const_cast<void*>(a));
  c.b.set_data_handle(const_cast<void*>(b));
  c.y.set_data_handle(y);
  static dnnl::stream stream(engine());
  const dnnl_status_t st =
      dnnl_primitive_execute(c.prim.get(), stream.get(), static_cast<int>(c.args.size()), c.args.data());
  FR_CHECK(st == dnnl_success, "oneDNN matmul failed with status ", static_cast<int>(st));
  stream.wait();
}

bool has_native_bf16() {
  static const bool yes = [] {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
    return (isa & bf16) == bf16;
  }();
  return yes;
}

}  // namespace flowrun::cpu
