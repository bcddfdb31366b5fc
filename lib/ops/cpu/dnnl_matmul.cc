// oneDNN matmul. Primitives are created on first use of a shape and cached together with their argument
// map, so the steady-state step only rebinds data handles and allocates nothing. Their scratchpads share one
// grow-only buffer (calls run one at a time under the cache's mutex): a scratchpad per primitive held 8 MiB
// for gpt-tiny, and twice that once train.adapt_threads had built primitives for a second thread count.
#include "ops/cpu/dnnl_matmul.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "ops/cpu/gemm_avx2.h"
#include "ops/cpu/grow_buffer.h"
#include "ops/cpu/parallel.h"
#include "ops/cpu/simd16.h"

namespace flowrun::cpu {

namespace {

// (operand dtype, y dtype, batch, m, n, k, lda, ldb, ta, tb, a shared, b shared, alpha, beta, threads, bias,
// ldy).
// The thread count is part of the key: oneDNN fixes a primitive's work split (and scratchpad) when it builds
// it, and a primitive built for more threads would start them all.
using Key = std::tuple<DType, DType, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, bool,
                       bool, float, float, int, bool, int64_t>;

struct Cached {
  dnnl::matmul prim;
  dnnl::memory a, b, y, bias, scratch;  // scratch: bound to the shared buffer at each call
  size_t scratch_bytes = 0;
  std::vector<dnnl_exec_arg_t>
      args;  // built once, for the C API (the C++ execute() builds a vector per call)
};

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::memory::data_type dnnl_type(DType t) {
  return t == DType::bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

dnnl::memory::desc desc(dnnl::memory::data_type t, int64_t batch, int64_t rows, int64_t cols, bool trans,
                        bool shared, int64_t ld) {
  // Logical (batch, rows, cols); a transposed operand is stored (cols, rows); `ld` is the stored row length;
  // a shared one has batch stride 0.
  // One matrix below AVX-512 is described in 2-D, the plain form of oneDNN's gemm-driver matmul. (A first
  // stand-alone run on Zen 3 gave the 3-D 1 x 128 x 128 tile 39 GFLOP/s on one thread against 69 for the
  // 2-D one; a rerun gave both 69, so no gain of its own is established.)
  if (batch == 1 && dnnl_gemm_driver())
    return dnnl::memory::desc({rows, cols}, t, dnnl::memory::dims{trans ? 1 : ld, trans ? ld : 1});
  const dnnl::memory::dims dims = {batch, rows, cols};
  // A zero batch stride only where it matters (batch > 1): oneDNN falls back to its slow reference kernel
  // for a zero stride even on a single matrix.
  const dnnl::memory::dims strides = {shared && batch > 1 ? 0 : rows * cols, trans ? 1 : ld, trans ? ld : 1};
  return dnnl::memory::desc(dims, t, strides);
}

Cached make(const Key& key) {
  const auto [dtype, ytype, batch, m, n, k, lda, ldb, ta, tb, a_shared, b_shared, alpha, beta, threads, bias,
              ldy] = key;
  (void)threads;  // oneDNN reads the current count itself
  const auto t = dnnl_type(dtype);
  const auto ad = desc(t, batch, m, k, ta, a_shared, lda);
  const auto bd = desc(t, batch, k, n, tb, b_shared, ldb);
  const auto yd = desc(dnnl_type(ytype), batch, m, n, false, false, ldy);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(beta);
    attr.set_post_ops(po);
  }
  // A bias row (1 x n, the operands' dtype) broadcast over the batch and rows, added to the f32 sum before
  // the one rounding.
  const dnnl::memory::desc bias_d = !bias ? dnnl::memory::desc()
                                    : batch == 1 && dnnl_gemm_driver()
                                        ? dnnl::memory::desc({1, n}, t, dnnl::memory::dims{n, 1})
                                        : dnnl::memory::desc({1, 1, n}, t, dnnl::memory::dims{n, n, 1});
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, bd, bias_d, yd), attr, engine());
  Cached c{dnnl::matmul(pd),
           dnnl::memory(ad, engine(), nullptr),
           dnnl::memory(bd, engine(), nullptr),
           dnnl::memory(yd, engine(), nullptr),
           dnnl::memory(bias_d, engine(), nullptr),
           dnnl::memory(pd.scratchpad_desc(), engine(), nullptr),
           pd.scratchpad_desc().get_size(),
           {}};
  c.args = {{DNNL_ARG_SRC, c.a.get()},
            {DNNL_ARG_WEIGHTS, c.b.get()},
            {DNNL_ARG_DST, c.y.get()},
            {DNNL_ARG_SCRATCHPAD, c.scratch.get()}};
  if (bias) c.args.push_back({DNNL_ARG_BIAS, c.bias.get()});
  return c;
}

// The cache's and the shared scratchpad's lock.
std::mutex& cache_mutex() {
  static std::mutex mu;
  return mu;
}

// A cache of primitives with the scratchpad and stream they run with: one for the calls on the calling
// thread, one per thread for run_tiles.
struct Slot {
  std::map<Key, Cached> cache;
  GrowBuffer scratch;
  GrowBuffer panel;  // run_tiles' copy of a B chunk
  dnnl::stream stream{engine()};

  Cached& at(const Key& key) {
    auto it = cache.find(key);
    if (it == cache.end()) it = cache.emplace(key, make(key)).first;
    return it->second;
  }
  void run(const Key& key, const void* a, const void* b, void* y, const void* bias = nullptr) {
    Cached& c = at(key);
    c.scratch.set_data_handle(scratch.reserve(c.scratch_bytes));
    c.a.set_data_handle(const_cast<void*>(a));
    c.b.set_data_handle(const_cast<void*>(b));
    c.y.set_data_handle(y);
    if (bias) c.bias.set_data_handle(const_cast<void*>(bias));
    const dnnl_status_t st =
        dnnl_primitive_execute(c.prim.get(), stream.get(), static_cast<int>(c.args.size()), c.args.data());
    FR_CHECK(st == dnnl_success, "oneDNN matmul failed with status ", static_cast<int>(st));
    stream.wait();
  }
};

// Runs the cached primitive of `key`; the caller holds cache_mutex().
void run(const Key& key, const void* a, const void* b, void* y, const void* bias = nullptr) {
  static Slot main;
  main.run(key, a, b, y, bias);
}

// oneDNN splits the K sum of a product between threads when its output alone gives them too little work:
// a weight gradient (A transposed, K >= 2048) or an f32 product with K >= 20000 and M, N <= 512. That plan is
// made for the thread count, so the bits would change with it (a 1-layer GPT at batch 64 differed between 1
// and 6 threads). flowrun cuts such sums into fixed chunks of kChunkK itself, added in order into an f32
// accumulator, whatever the thread count: oneDNN never sees a K it would split.
constexpr int64_t kChunkK = 1024;

bool splits_k(DType dtype, int64_t batch, int64_t m, int64_t n, int64_t k, bool ta) {
  return batch == 1 && ((ta && k >= 2048) || (dtype == DType::f32 && k >= 20000 && m <= 512 && n <= 512));
}

void check_types(DType dtype, DType ytype) {
  FR_CHECK((dtype == DType::f32 || dtype == DType::bf16) && (ytype == dtype || ytype == DType::f32),
           "oneDNN matmul: unsupported dtypes ", dtype_name(dtype), " -> ", dtype_name(ytype));
}

// oneDNN's AMX kernels split the K sum of a product with A transposed (a weight gradient) between threads by
// a plan made for their count, even for K = 1024 and a 256 x 256 output: its bits changed between 1 and 2
// threads, so a bf16 run could not adapt its thread count, nor match its own run at another count. There the
// output is cut into fixed tiles of at most kTile x kAmxTileN, each tile one call of a primitive built for
// one thread (its whole K sum in that call; oneDNN runs it in its gemm:jit kernel, not the brgemm one it
// gives a whole product), the tiles spread over the threads. Each tile repacks its own slices of A and B: at
// 2 threads gpt-tiny's bf16 step took 67.8-70.9 ms against 66.0-66.7 with oneDNN's split (alternating runs).
// 128 x 256 tiles: one thread's 128 x 2048 x 256 product ran at 476-516 GFLOP/s where 128 x 128 ran at
// 339-398 (oneDNN alone), and gpt-tiny's bf16 step took 60.7-64.1 ms against 66.2-74.1 with 128 x 128 and
// 62.2-66.4 with 128 x 512 (3 alternating runs, 2026-12-07, once every tile's packing buffer stopped being
// mapped afresh, apps/flowrun.cc; 256 x 256 leaves a 256 x 256 gradient one tile for two threads).
//
// Below AVX-512 oneDNN 2.6 has no brgemm matmul: f32 products run through its BLAS-style gemm driver, whose
// plan for the thread count picks the kernel (copy-based or no-copy, each with its own K blocking) and may
// split K. On a 2-core Zen 3 host the MLP's losses differed between 1 and 2 threads, and a run whose adaptive
// thread count changed mid-run no longer resumed bit for bit. There the f32 products run in flowrun's own
// gemm_avx2 where the CPU has AVX2 (Zen 3, Haswell to Comet Lake: 0.9-1.5x these tiles' rate on single
// products in flowrun_bench; 131-143 GFLOP/s inside gpt-tiny's step, where the tiles' 2048^3 probe read
// 72-97; gemm_avx2.h), and otherwise every product runs as the tiles above (kTile x kTile there), a batch's
// matrices tile by tile, and each tile's K sum in fixed chunks of at most kTileK, added onto the tile in
// order (beta 1 after the first chunk): for a one-thread product with a side under 264 oneDNN picks its
// no-copy kernel, which ran 128 x 128 tiles at K = 1024 well below its rate at K = 256 (2 threads, Zen 3,
// flowrun_bench, chunks and 2-D descriptors (desc) against whole-K 3-D tiles: 1024^3 72 -> 86 GFLOP/s,
// gpt-tiny's weight gradients 61-68 -> 70-82; oneDNN's own threads ran 1024^3 at 146, with its copy-based
// kernel).
constexpr int64_t kTile = 128, kAmxTileN = 256;
constexpr int64_t kTileK = 256;
//
// There a chunk of B whose rows lie a multiple of 2 KiB apart is copied first, into rows nt + kPanelPad
// floats apart: read in place, such rows alias the tile's rows of C in the low address bits and the
// no-copy kernel's loads wait on its stores. At 2 threads on Zen 3 (flowrun_bench, best of 3 alternating
// runs) 1024^3 went from 67 to 113 GFLOP/s, gpt-tiny's 2048 x 256 x 1024 from 71 to 120, its 256 x 1024
// weight gradient from 71 to 88 and the MLP's 128 x 784 x 512 from 88 to 117; with B's rows 1 KiB apart
// (gpt-tiny's 2048 x 1024 x 256 input gradient) the copy cost more than it gained (114 -> 103), and a
// transposed B (a linear layer's weight) read in place is not slowed.
constexpr int64_t kPanelPad = 4, kAliasedLd = 512;

// B's kc x nt chunk at b (stored k x n, rows ldb apart) into `panel`, its rows nt + kPanelPad apart.
const char* copy_panel(GrowBuffer& panel, const float* b, int64_t ldb, int64_t kc, int64_t nt) {
  const int64_t ld = nt + kPanelPad;
  auto* p = static_cast<float*>(panel.reserve(static_cast<size_t>(kc * ld) * sizeof(float)));
  for (int64_t r = 0; r < kc; ++r)
    std::memcpy(p + r * ld, b + r * ldb, static_cast<size_t>(nt) * sizeof(float));
  return reinterpret_cast<const char*>(p);
}

void run_tiles(const Key& whole, int64_t a_stride, int64_t b_stride, const void* a, const void* b, void* y,
               const void* bias = nullptr) {
  const auto [dtype, ytype, batch, m, n, k, lda, ldb, ta, tb, a_shared, b_shared, alpha, beta, threads,
              biased, ldy] = whole;
  const int64_t tile_n = dnnl_gemm_driver() ? kTile : kAmxTileN;
  const int64_t rows = (m + kTile - 1) / kTile, cols = (n + tile_n - 1) / tile_n, per_matrix = rows * cols,
                tiles = batch * per_matrix;
  // Chunks of equal length (a multiple of 8, the last one shorter), from K alone; one chunk for K = 0 too.
  const int64_t chunks = dnnl_gemm_driver() && ytype == DType::f32
                             ? std::max<int64_t>(1, (k + kTileK - 1) / kTileK)
                             : 1,
                chunk = chunks == 1 ? k : ((k + chunks - 1) / chunks + 7) / 8 * 8;
  auto each_chunk = [&](auto&& f) {
    int64_t k0 = 0;
    do f(k0);
    while ((k0 += chunk) < k);
  };
  const bool copies_b = dnnl_gemm_driver() && dtype == DType::f32 && !tb && ldb % kAliasedLd == 0;
  const int team = static_cast<int>(std::min<int64_t>(omp_in_parallel() ? 1 : omp_get_max_threads(), tiles));
  // Never destroyed: this vector is made before the engine its slots' streams and primitives hold (engine()
  // runs in the first Slot's constructor), so at exit it would be destroyed after that engine.
  static auto& slots = *new std::vector<std::unique_ptr<Slot>>;
  while (slots.size() < static_cast<size_t>(team)) slots.push_back(std::make_unique<Slot>());
  auto key_of = [&](int64_t t, int64_t k0) {
    const int64_t i = t % per_matrix / cols, j = t % cols;
    const int64_t mt = std::min(kTile, m - i * kTile), nt = std::min(tile_n, n - j * tile_n);
    const bool first = k0 == 0;  // the later chunks add onto the tile (beta 1), without the bias
    return Key{
        dtype, ytype, 1,     mt,    nt,    std::min(chunk, k - k0), lda, copies_b ? nt + kPanelPad : ldb,
        ta,    tb,    false, false, alpha, first ? beta : 1.0f,     1,   biased && first,
        ldy};
  };
  {
    const OneThread one;
    for (int slot = 0; slot < team; ++slot)
      for (int64_t t = 0; t < std::min(tiles, per_matrix); ++t)
        each_chunk([&](int64_t k0) { slots[static_cast<size_t>(slot)]->at(key_of(t, k0)); });
  }
  const size_t size = dtype_size(dtype), ysize = dtype_size(ytype);
  // A failed call is rethrown here: an exception must not leave an OpenMP region.
  std::exception_ptr failed;
#pragma omp parallel num_threads(team)
  {
    // Each call plans for one thread even in a team of one, which OpenMP does not count as parallel: oneDNN
    // would plan for (and start) the caller's thread count there.
    omp_set_num_threads(1);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t mat = t / per_matrix, i = (t % per_matrix / cols) * kTile, j = (t % cols) * tile_n;
      try {
        Slot& slot = *slots[static_cast<size_t>(omp_get_thread_num())];
        each_chunk([&](int64_t k0) {
          const Key key = key_of(t, k0);
          const char* bp = static_cast<const char*>(b) +
                           static_cast<size_t>(mat * b_stride + (tb ? j * ldb + k0 : k0 * ldb + j)) * size;
          if (copies_b)
            bp = copy_panel(slot.panel, reinterpret_cast<const float*>(bp), ldb, std::get<5>(key),
                            std::get<4>(key));
          slot.run(
              key,
              static_cast<const char*>(a) +
                  static_cast<size_t>(mat * a_stride + (ta ? k0 * lda + i : i * lda + k0)) * size,
              bp, static_cast<char*>(y) + static_cast<size_t>(mat * m * ldy + i * ldy + j) * ysize,
              bias && k0 == 0 ? static_cast<const char*>(bias) + static_cast<size_t>(j) * size : nullptr);
        });
      } catch (...) {
#pragma omp critical(flowrun_matmul_tile_error)
        if (!failed) failed = std::current_exception();
      }
    }
  }
  if (failed) std::rethrow_exception(failed);
}

// Whether an f32 product runs in gemm_avx2 (AVX2 hosts: the comment above kTile says why).
bool runs_gemm_avx2(DType dtype, DType ytype) {
  return dtype == DType::f32 && ytype == DType::f32 && gemm_avx2_applies();
}

// dnnl_matmul's product; the caller holds cache_mutex().
void product(DType dtype, DType ytype, int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb,
             int64_t a_stride, int64_t b_stride, float alpha, float beta, const void* a, const void* b,
             void* y) {
  const int threads = omp_get_max_threads();
  const int64_t lda = ta ? m : k, ldb = tb ? k : n;
  if (runs_gemm_avx2(dtype, ytype)) {
    gemm_avx2(batch, m, n, k, ta, tb, a_stride, b_stride, alpha, beta, static_cast<const float*>(a), lda,
              static_cast<const float*>(b), ldb, nullptr, static_cast<float*>(y), n);
    return;
  }
  if ((dtype == DType::bf16 && ta && batch == 1 && has_amx_bf16()) || dnnl_gemm_driver()) {
    run_tiles({dtype, ytype, batch, m, n, k, lda, ldb, ta, tb, false, false, alpha, beta, 1, false, n},
              a_stride, b_stride, a, b, y);
    return;
  }
  if (!splits_k(dtype, batch, m, n, k, ta)) {
    run({dtype, ytype, batch, m, n, k, lda, ldb, ta, tb, a_stride == 0, b_stride == 0, alpha, beta, threads,
         false, n},
        a, b, y);
    return;
  }
  // A chunk [k0, k0 + kc) is A's columns k0.. (stored transposed: its rows) and B's rows k0.. (stored
  // transposed: its columns). The chunks accumulate in f32; a bf16 y is rounded once.
  static std::vector<float> wide;
  if (ytype == DType::bf16) wide.resize(static_cast<size_t>(m * n));
  void* acc = ytype == DType::f32 ? y : wide.data();
  const size_t size = dtype_size(dtype);
  for (int64_t k0 = 0; k0 < k; k0 += kChunkK) {
    const int64_t kc = std::min(kChunkK, k - k0);
    const float chunk_beta = k0 > 0 ? 1.0f : ytype == DType::f32 ? beta : 0.0f;
    run({dtype, DType::f32, 1, m, n, kc, lda, ldb, ta, tb, false, false, alpha, chunk_beta, threads, false,
         n},
        static_cast<const char*>(a) + static_cast<size_t>(ta ? k0 * m : k0) * size,
        static_cast<const char*>(b) + static_cast<size_t>(tb ? k0 : k0 * n) * size, acc);
  }
  if (ytype == DType::bf16) {
    bf16* out = static_cast<bf16*>(y);
    parallel_for(m * n, 4096, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i)
        out[i] = float_to_bf16(beta == 0.0f ? wide[i] : wide[i] + beta * bf16_to_float(out[i]));
    });
  }
}

#if defined(__AVX512F__)  // the transposition back runs simd16::transpose16
// An f32 weight gradient with fewer rows than columns (A transposed, m < n) ran at 0.88x the rate of its
// transpose in oneDNN's matmul: gpt-tiny's MLP output projection, 256 x 1024 over 2048 rows, 4.17 ms
// against 3.46 for the 1024 x 256 one (2 threads, alternating, operands in cache). So y^T = B^T A is
// computed and transposed into y, 16 x 16 blocks through registers: in gpt-tiny's step that product took
// 3.87-3.96 ms instead of 4.02-4.22 (two profiled runs of each build, alternating), kjv_llama's MLP down
// projection (192 x 512) 2.83-2.96 ms instead of 3.11-3.45. Only for the long sums cut into K chunks
// (splits_k): over the MLP's 128 rows the transposition cost more than the product gained (its step
// 1.73-1.79 ms against 1.58-1.66).
bool swaps(DType dtype, DType ytype, int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb,
           float beta) {
  return dtype == DType::f32 && ytype == DType::f32 && ta && !tb && m < n && beta == 0.0f &&
         splits_k(dtype, batch, m, n, k, ta);
}
#endif

}  // namespace

void dnnl_matmul(DType dtype, DType ytype, int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb,
                 int64_t a_stride, int64_t b_stride, float alpha, float beta, const void* a, const void* b,
                 void* y) {
  check_types(dtype, ytype);
  if (batch == 0 || m == 0 || n == 0) return;
  std::lock_guard<std::mutex> lock(cache_mutex());
#if defined(__AVX512F__)
  if (swaps(dtype, ytype, batch, m, n, k, ta, tb, beta)) {
    static GrowBuffer transposed;
    auto* yt = static_cast<float*>(transposed.reserve(static_cast<size_t>(m * n) * sizeof(float)));
    // B (stored k x n) transposed times A (stored k x m, now the right operand as stored).
    product(dtype, ytype, 1, n, m, k, true, false, 0, 0, alpha, 0.0f, b, a, yt);
    const int64_t blocks = (m + 15) / 16;
    parallel_for(blocks, 1, [&](int64_t s, int64_t e) {
      for (int64_t ib = s; ib < e; ++ib) {
        const int64_t i0 = ib * 16;
        for (int64_t j0 = 0; j0 < n; j0 += 16)
          simd16::transpose16(yt + j0 * m + i0, m, std::min<int64_t>(16, n - j0),
                              std::min<int64_t>(16, m - i0),
                              reinterpret_cast<uint32_t*>(static_cast<float*>(y) + i0 * n + j0), n);
      }
    });
    return;
  }
#endif
  product(dtype, ytype, batch, m, n, k, ta, tb, a_stride, b_stride, alpha, beta, a, b, y);
}

bool dnnl_matmul_whole_k(int64_t m, int64_t n, int64_t k, bool ta) {
  return gemm_avx2_applies() || (!dnnl_gemm_driver() && !splits_k(DType::f32, 1, m, n, k, ta));
}

void dnnl_linear(DType dtype, DType ytype, int64_t rows, int64_t out, int64_t in, const void* x,
                 const void* w, const void* bias, void* y) {
  check_types(dtype, ytype);
  if (rows == 0 || out == 0) return;
  if (runs_gemm_avx2(dtype, ytype)) {
    std::lock_guard<std::mutex> lock(cache_mutex());
    gemm_avx2(1, rows, out, in, false, true, 0, 0, 1.0f, 0.0f, static_cast<const float*>(x), in,
              static_cast<const float*>(w), in, static_cast<const float*>(bias), static_cast<float*>(y), out);
    return;
  }
  if (bias && splits_k(dtype, 1, rows, out, in, false)) {
    FR_CHECK(ytype == dtype, "dnnl_linear: a split sum's bias is seeded in the operands' dtype");
    // The K chunks add onto y in order: seed it with the bias rows, as the first chunk's sum would add it.
    const size_t size = dtype_size(dtype);
    parallel_for(rows, 64, [&](int64_t s, int64_t e) {
      for (int64_t r = s; r < e; ++r)
        std::memcpy(static_cast<char*>(y) + static_cast<size_t>(r * out) * size, bias,
                    static_cast<size_t>(out) * size);
    });
    dnnl_matmul(dtype, ytype, 1, rows, out, in, false, true, 0, 0, 1.0f, 1.0f, x, w, y);
    return;
  }
  if (!bias) {
    dnnl_matmul(dtype, ytype, 1, rows, out, in, false, true, 0, 0, 1.0f, 0.0f, x, w, y);
    return;
  }
  std::lock_guard<std::mutex> lock(cache_mutex());
  if (dnnl_gemm_driver()) {
    run_tiles({dtype, ytype, 1, rows, out, in, in, in, false, true, false, false, 1.0f, 0.0f, 1, true, out},
              0, 0, x, w, y, bias);
    return;
  }
  run({dtype, ytype, 1, rows, out, in, in, in, false, true, false, false, 1.0f, 0.0f, omp_get_max_threads(),
       true, out},
      x, w, y, bias);
}

bool dnnl_gemm_driver() {
  static const bool yes = [] {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto avx512 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
    return (isa & avx512) != avx512;
  }();
  return yes;
}

bool has_native_bf16() {
  static const bool yes = [] {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
    return (isa & bf16) == bf16;
  }();
  return yes;
}

bool has_amx_bf16() {
  static const bool yes = [] {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto amx = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_amx);
    return (isa & amx) == amx;
  }();
  return yes;
}

}  // namespace flowrun::cpu
