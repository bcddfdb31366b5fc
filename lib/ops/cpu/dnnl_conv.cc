// oneDNN f32 and bf16 convolution primitives. Each (op, geometry) builds its primitive once, letting oneDNN
// choose its blocked layouts (format_tag::any: with plain nchw/oihw descriptors oneDNN 2.6 picks far slower
// kernels, and a ResNet-20 step spends 800 ms in convolutions instead of 86 ms with the reorders). Reorder
// buffers and the user scratchpad are shared and grow-only, so a steady-state call only rebinds data handles
// and allocates nothing of ours.
#include "ops/cpu/dnnl_conv.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/cpu/conv_direct8_f32.h"
#include "ops/cpu/conv_direct_f32.h"
#include "ops/cpu/conv_direct_weights.h"
#include "ops/cpu/conv_wgrad8_f32.h"
#include "ops/cpu/conv_wgrad_bf16.h"
#include "ops/cpu/conv_wgrad_few_f32.h"
#include "ops/cpu/conv_wino_bf16.h"
#include "ops/cpu/dnnl_matmul.h"
#include "ops/cpu/elementwise.h"
#include "ops/cpu/grow_buffer.h"
#include "ops/cpu/parallel.h"

namespace flowrun::cpu {

namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

enum class Kind { fwd, fwd_bias, bwd_data, bwd_weights };

using Key = std::array<int64_t, 21>;

// Execution arguments in the C API's form, built once: the C++ execute() builds a fresh vector on every call,
// and a steady-state step must not allocate.
using Args = std::vector<dnnl_exec_arg_t>;

void execute(const dnnl::primitive& p, dnnl::stream& s, const Args& a) {
  const dnnl_status_t st = dnnl_primitive_execute(p.get(), s.get(), static_cast<int>(a.size()), a.data());
  FR_CHECK(st == dnnl_success, "oneDNN convolution failed with status ", static_cast<int>(st));
}

// One tensor the primitive reads or writes: `user` wraps flowrun's plain buffer (rebound per call); `inner`
// is the primitive's own layout, the same memory as `user` unless a reorder is needed.
struct Port {
  int arg = 0;
  bool output = false;
  dnnl::memory user, inner;
  bool reordered = false;
  size_t inner_bytes = 0;  // when reordered, inner lives in the shared buffer of its port index
  dnnl::reorder reorder;   // only when reordered, with its (from, to) arguments
  Args reorder_args;
};

struct Entry {
  dnnl::primitive prim;
  std::vector<Port> ports;
  dnnl::memory scratch;  // lives in the shared scratchpad buffer
  size_t scratch_bytes = 0;
  Args args;
};

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// The thread count is part of the key: oneDNN fixes a primitive's work split (and scratchpad) when it
// builds it, so a changed count (train.threads) gets a primitive made for it.
Key key_of(Kind k, dt t, const ConvGeom& g) {
  const int64_t threads = omp_get_max_threads(), kind = static_cast<int64_t>(k),
                type = static_cast<int64_t>(t);
  return {threads, kind, type, g.n,  g.c,  g.h,      g.w,         g.o,         g.kh,     g.kw,  g.sh,
          g.sw,    g.ph, g.pw, g.dh, g.dw, g.groups, g.x_blocked, g.y_blocked, g.nchw8c, g.nhwc};
}

// Descriptors of flowrun's tensors: activations NCHW, or nChw16c where the layout pass keeps them blocked
// (ConvGeom::x_blocked, y_blocked), nChw8c with ConvGeom::nchw8c, NHWC with ConvGeom::nhwc: then they are
// what oneDNN picks, and no reorder runs. A grouped weight (o, c/g, kh, kw) is (g, o/g, c/g, kh, kw) goihw
// over the same bytes.
tag blocked_tag(const ConvGeom& g) {
  return g.nhwc ? tag::nhwc : g.nchw8c ? tag::nChw8c : tag::nChw16c;
}
dnnl::memory::desc src_desc(const ConvGeom& g, dt d, tag t) {
  return {{g.n, g.c, g.h, g.w}, d, t};
}
dnnl::memory::desc dst_desc(const ConvGeom& g, dt d, tag t) {
  return {{g.n, g.o, g.oh, g.ow}, d, t};
}
dnnl::memory::desc wei_desc(const ConvGeom& g, dt d, bool any) {
  if (g.groups == 1) return {{g.o, g.c, g.kh, g.kw}, d, any ? tag::any : tag::oihw};
  return {{g.groups, g.og(), g.cg(), g.kh, g.kw}, d, any ? tag::any : tag::goihw};
}
dnnl::memory::desc bias_desc(const ConvGeom& g, dt d) {
  return {{g.o}, d, tag::x};
}

// Stride, dilation (oneDNN counts the gaps: d - 1), and left/right padding. Right padding equals left as in
// PyTorch; oneDNN floors the output size the same way, so windows past the end are dropped alike.
struct Conv {
  dnnl::memory::dims stride, dilate, pad;
};
Conv conv_of(const ConvGeom& g) {
  return {{g.sh, g.sw}, {g.dh - 1, g.dw - 1}, {g.ph, g.pw}};
}

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr a;
  a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return a;
}

// Winograd's F(4x4, 3x3) (oneDNN's jit_wino_4x3, AVX-512 f32 only) for 3x3 stride-1 convolutions with
// enough channels: it does 4x fewer multiplies in the transformed domain, and on ResNet-20's shapes (Zen 4,
// 2 threads) it took the 32- and 64-channel forward and input-gradient passes from 1.24 and 1.12 ms to 0.69
// and 0.53 ms, and every weight gradient from 16 channels up 15-35% down (ResNet-20's step 81 -> 65.5 ms);
// with 16 channels the forward was 5% and the input gradient 45% slower than the direct kernel, hence the
// thresholds. The weight gradient also wants whole 4x4 output tiles: on the bench CNN's 14x14 planes it was
// slower than direct, and its scratchpad (9.9 MB declared per 4-sample block whatever the plane, most of it
// never touched) made `flowrun plan` overshoot the process by 18%. Winograd rounds differently from the
// direct kernel (a ResNet's updated weights 2e-5 from PyTorch's float64 step against 9e-6,
// scripts/check_parity.py). Where oneDNN has no Winograd kernel the convolution runs direct.
bool winograd_fits(Kind k, dt t, const ConvGeom& g) {
  const bool weights = k == Kind::bwd_weights;
  const int64_t least = weights ? 16 : 32;
  return t == dt::f32 && g.groups == 1 && g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.dh == 1 &&
         g.dw == 1 && g.c % 16 == 0 && g.o % 16 == 0 && g.c >= least && g.o >= least &&
         (!weights || (g.oh % 4 == 0 && g.ow % 4 == 0));
}

// The forward descriptor: its primitive for the forward op, and the hint the backward ones require.
dnnl::convolution_forward::primitive_desc fwd_pd(const ConvGeom& g, dt t, bool bias, dnnl::algorithm alg) {
  const Conv v = conv_of(g);
  const auto s = src_desc(g, t, tag::any), w = wei_desc(g, t, true), d = dst_desc(g, t, tag::any);
  const auto pk = dnnl::prop_kind::forward_training;
  const auto desc = bias
                        ? dnnl::convolution_forward::desc(pk, alg, s, w, bias_desc(g, t), d, v.stride,
                                                          v.dilate, v.pad, v.pad)
                        : dnnl::convolution_forward::desc(pk, alg, s, w, d, v.stride, v.dilate, v.pad, v.pad);
  return {desc, user_scratchpad(), engine()};
}

// With `runnable` false only the sizes are filled in (Port::inner_bytes, Entry::scratch_bytes): no primitive
// or reorder is created (creating them generates code), for dnnl_conv2d_buffers.
Port port(int arg, bool output, const dnnl::memory::desc& user, const dnnl::memory::desc& inner,
          bool runnable) {
  Port p;
  p.arg = arg;
  p.output = output;
  p.reordered = inner != user;
  p.inner_bytes = inner.get_size();
  if (!runnable) return p;
  p.user = dnnl::memory(user, engine(), nullptr);
  if (!p.reordered) {
    p.inner = p.user;
    return p;
  }
  p.inner = dnnl::memory(inner, engine(), nullptr);
  const dnnl::memory &from = output ? p.inner : p.user, &to = output ? p.user : p.inner;
  p.reorder = dnnl::reorder(from, to);
  p.reorder_args = {{DNNL_ARG_FROM, from.get()}, {DNNL_ARG_TO, to.get()}};
  return p;
}

template <typename Primitive, typename PD>
Entry entry_of(const PD& pd, std::vector<Port> ports, bool runnable) {
  Entry e;
  e.ports = std::move(ports);
  e.scratch_bytes = pd.scratchpad_desc().get_size();
  if (!runnable) return e;
  e.prim = Primitive(pd);
  e.scratch = dnnl::memory(pd.scratchpad_desc(), engine(), nullptr);
  for (const Port& p : e.ports) e.args.push_back({p.arg, p.inner.get()});
  e.args.push_back({DNNL_ARG_SCRATCHPAD, e.scratch.get()});
  return e;
}

Entry build_with(dnnl::algorithm alg, Kind k, dt t, const ConvGeom& g, bool runnable) {
  const Conv v = conv_of(g);
  const tag blocked = blocked_tag(g);
  const auto x = src_desc(g, t, g.x_blocked ? blocked : tag::nchw),
             y = dst_desc(g, t, g.y_blocked ? blocked : tag::nchw), w = wei_desc(g, t, false);
  switch (k) {
    case Kind::fwd:
    case Kind::fwd_bias: {
      const auto pd = fwd_pd(g, t, k == Kind::fwd_bias, alg);
      std::vector<Port> ps = {port(DNNL_ARG_SRC, false, x, pd.src_desc(), runnable),
                              port(DNNL_ARG_WEIGHTS, false, w, pd.weights_desc(), runnable),
                              port(DNNL_ARG_DST, true, y, pd.dst_desc(), runnable)};
      if (k == Kind::fwd_bias)
        ps.push_back(port(DNNL_ARG_BIAS, false, bias_desc(g, t), bias_desc(g, t), runnable));
      return entry_of<dnnl::convolution_forward>(pd, std::move(ps), runnable);
    }
    case Kind::bwd_data: {
      const dnnl::convolution_backward_data::desc d(alg, src_desc(g, t, tag::any), wei_desc(g, t, true),
                                                    dst_desc(g, t, tag::any), v.stride, v.dilate, v.pad,
                                                    v.pad);
      const dnnl::convolution_backward_data::primitive_desc pd(d, user_scratchpad(), engine(),
                                                               fwd_pd(g, t, false, alg));
      return entry_of<dnnl::convolution_backward_data>(
          pd,
          {port(DNNL_ARG_DIFF_DST, false, y, pd.diff_dst_desc(), runnable),
           port(DNNL_ARG_WEIGHTS, false, w, pd.weights_desc(), runnable),
           port(DNNL_ARG_DIFF_SRC, true, x, pd.diff_src_desc(), runnable)},
          runnable);
    }
    case Kind::bwd_weights: {  // one block's f32 partial of the weight gradient, in oneDNN's layout (below)
      const dnnl::convolution_backward_weights::desc d(alg, src_desc(g, t, tag::any),
                                                       wei_desc(g, dt::f32, true), dst_desc(g, t, tag::any),
                                                       v.stride, v.dilate, v.pad, v.pad);
      const dnnl::convolution_backward_weights::primitive_desc pd(d, user_scratchpad(), engine(),
                                                                  fwd_pd(g, t, false, alg));
      return entry_of<dnnl::convolution_backward_weights>(
          pd,
          {port(DNNL_ARG_DIFF_DST, false, y, pd.diff_dst_desc(), runnable),
           port(DNNL_ARG_SRC, false, x, pd.src_desc(), runnable),
           port(DNNL_ARG_DIFF_WEIGHTS, true, pd.diff_weights_desc(), pd.diff_weights_desc(), runnable)},
          runnable);
    }
  }
  FR_CHECK(false, "unknown conv kind");
  return {};
}

Entry build(Kind k, dt t, const ConvGeom& g, bool runnable = true) {
  if (winograd_fits(k, t, g)) {
    try {
      return build_with(dnnl::algorithm::convolution_winograd, k, t, g, runnable);
    } catch (const dnnl::error& e) {
      if (e.status != dnnl_unimplemented) throw;
    }
  }
  return build_with(dnnl::algorithm::convolution_direct, k, t, g, runnable);
}

// Runs entry e on the given buffers, in the order of build()'s ports, with reorder targets and scratchpad in
// the given pools.
void run_entry(Entry& e, std::initializer_list<const void*> bufs, std::array<GrowBuffer, 4>& port_buf,
               GrowBuffer& scratch_buf, dnnl::stream& stream) {
  FR_CHECK(bufs.size() == e.ports.size(), "conv buffer count");
  e.scratch.set_data_handle(scratch_buf.reserve(e.scratch_bytes));
  size_t i = 0;
  for (const void* b : bufs) {
    Port& p = e.ports[i];
    p.user.set_data_handle(const_cast<void*>(b));
    if (p.reordered) p.inner.set_data_handle(port_buf[i].reserve(p.inner_bytes));
    if (!p.output && p.reordered) execute(p.reorder, stream, p.reorder_args);
    ++i;
  }
  execute(e.prim, stream, e.args);
  for (Port& p : e.ports)
    if (p.output && p.reordered) execute(p.reorder, stream, p.reorder_args);
  stream.wait();
}

// The pools of one thread of the weight gradient, and its primitives (each binds this slot's buffers).
struct Slot {
  std::array<GrowBuffer, 4> port_buf;
  GrowBuffer scratch_buf;
  GrowBuffer repack;  // the own bf16 weight gradients' image buffers
  GrowBuffer tiles;   // wino3x3_bf16's tile buffers
  std::map<Key, Entry> cache;
  dnnl::stream stream{engine()};
};

// Reorder targets and the scratchpad are shared by all entries (calls run one at a time under mu) and grow
// to the largest need in the first step; buffers per entry held 93 MiB more for ResNet-20. The weight
// gradient has a slot per thread and the f32 partials of its blocks.
struct Shared {
  std::array<GrowBuffer, 4> port_buf;
  GrowBuffer scratch_buf;
  std::vector<std::unique_ptr<Slot>> slots;
  GrowBuffer partials;
  GrowBuffer wino_weights;    // wino3x3_bf16's transformed weights
  GrowBuffer wino_copies;     // its operands' nChw16c copies (Blocked)
  GrowBuffer direct_weights;  // direct3x3_f32's (or direct3x3_f32x8's) rearranged weights
  GrowBuffer direct_copies;   // their operands' nChw16c (nChw8c) copies
  // grad_weight's reorder of the summed partials from oneDNN's layout to f32 OIHW, per geometry.
  struct ToPlain {
    dnnl::memory from, to;
    dnnl::reorder reorder;
    Args args;
  };
  std::map<Key, ToPlain> to_plain;
  std::vector<Entry*> block_entries;  // grad_weight's primitive per (slot, block), kept to reuse its memory
  std::mutex mu;
};
Shared& shared() {
  static Shared s;
  return s;
}

dnnl::stream& main_stream() {
  static dnnl::stream s(engine());
  return s;
}

std::atomic<bool>& own_convs() {
  static std::atomic<bool> on{!has_amx_bf16()};
  return on;
}

// bf16 convolutions that wino3x3_bf16 runs.
bool runs_wino(dt t, const ConvGeom& g) {
  return t == dt::bf16 && own_bf16_convs() && !g.nhwc && wino3x3_bf16_serves(g);
}

// The threads an own kernel's region starts for `items` work items: one inside another region.
int team_of(int64_t items) {
  return static_cast<int>(std::min<int64_t>(omp_in_parallel() ? 1 : omp_get_max_threads(), items));
}

int wino_team(const ConvGeom& g) {
  return team_of(wino3x3_bf16_items(g));
}

// wino3x3_bf16's and direct3x3_f32's kernels read and write nChw16c only (direct3x3_f32x8's take nChw8c
// copies, or read nChw16c in place): an NCHW operand (an eager run's, or the gradient a global pooling sends
// back to the last convolution) goes through a blocked copy, and so does an nChw8c one where the kernel's
// blocks are 16 wide (a graph laid out in nChw8c on an AVX-512 host). The copies are exact, so the bits are
// the same in every layout, and an eager run's are the compiled one's.
class Blocked {
 public:
  struct Operand {
    bool plain;  // in NCHW
    bool eight;  // in nChw8c
    int64_t channels, hw;
  };
  // The operands in order, of `elem`-byte elements, for a kernel whose channel blocks are `lanes` wide.
  Blocked(const ConvGeom& g, size_t elem, int64_t lanes, std::initializer_list<Operand> operands)
      : n_(g.n), lanes_(lanes), elem_(elem), operands_(operands) {
    for (size_t i = 0; i < operands_.size(); ++i) {
      offset_.push_back(bytes_);
      const Operand& o = operands_[i];
      if (copied(i)) bytes_ += static_cast<size_t>(n_ * o.channels * o.hw) * elem_;
    }
  }
  size_t bytes() const { return bytes_; }
  bool copied(size_t i) const { return operands_[i].plain || (operands_[i].eight && lanes_ == 16); }
  // Operand i's blocked memory: `p` itself, or its copy in `buf`, filled from p when `read`.
  void* operand(GrowBuffer& buf, size_t i, const void* p, bool read) const {
    if (!copied(i)) return const_cast<void*>(p);
    char* copy = static_cast<char*>(buf.reserve(bytes_)) + offset_[i];
    if (read) convert(i, p, copy, true);
    return copy;
  }
  // Operand i's copy written back to its own memory `p` (an output).
  void write_back(size_t i, const void* copy, void* p) const {
    if (copied(i)) convert(i, copy, p, false);
  }

 private:
  void convert(size_t i, const void* from, void* to, bool to_kernel) const {
    const Operand& o = operands_[i];
    if (o.plain) return reorder_blocked(from, to, n_, o.channels, o.hw, elem_, lanes_, to_kernel);
    regroup_blocked(from, to, n_, o.channels, o.hw, elem_, to_kernel ? 8 : 16, to_kernel ? 16 : 8);
  }

  int64_t n_, lanes_;
  size_t elem_;
  std::vector<Operand> operands_;
  std::vector<size_t> offset_;
  size_t bytes_ = 0;
};

// The activation operands, x-shaped then y-shaped (a forward pass: x, y) or y-shaped first (an input
// gradient: dy, dx; a weight gradient: dy, x).
Blocked operands_of(const ConvGeom& g, bool y_first, size_t elem, int64_t lanes = 16) {
  const Blocked::Operand x{!g.x_blocked, g.x_blocked && g.nchw8c, g.c, g.h * g.w},
      y{!g.y_blocked, g.y_blocked && g.nchw8c, g.o, g.oh * g.ow};
  if (y_first) return Blocked(g, elem, lanes, {y, x});
  return Blocked(g, elem, lanes, {x, y});
}

// The forward pass or input gradient through wino3x3_bf16: the weights transformed once, the items split
// over the threads, each with its slot's tile buffers.
void run_wino(const ConvGeom& g, bool grad_input, const void* in_, const void* w, const void* bias,
              void* out_) {
  Shared& s = shared();
  std::lock_guard<std::mutex> lock(s.mu);
  const Blocked copies = operands_of(g, grad_input, 2);
  const void* in = copies.operand(s.wino_copies, 0, in_, true);
  void* out = copies.operand(s.wino_copies, 1, out_, false);
  void* v = s.wino_weights.reserve(wino3x3_bf16_weight_bytes(g));
  wino3x3_bf16_weights(g, grad_input, static_cast<const bf16*>(w), v);
  const int team = wino_team(g);
  while (s.slots.size() < static_cast<size_t>(team)) s.slots.push_back(std::make_unique<Slot>());
  const int64_t items = wino3x3_bf16_items(g);
  const size_t scratch = wino3x3_bf16_scratch_bytes(g);
#pragma omp parallel num_threads(team)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    void* own = s.slots[static_cast<size_t>(t)]->tiles.reserve(scratch);
    wino3x3_bf16(g, grad_input, static_cast<const bf16*>(in), v, static_cast<const bf16*>(bias),
                 static_cast<bf16*>(out), t * items / nt, (t + 1) * items / nt, own);
  }
  copies.write_back(1, out, out_);
}

// f32 convolutions that direct3x3_f32 runs: where oneDNN's Winograd does not (the forward pass and input
// gradient share winograd_fits' thresholds). On ResNet-20's 16-channel layers (64x16x32x32, in nChw16c, 2
// threads, Intel AMX host) oneDNN's direct kernel took 1.24 ms a pass.
// On AVX2 hosts (nChw8c) direct3x3_f32x8 runs them in place of oneDNN's AVX2 direct kernel, in a compiled
// step (nChw8c) and an eager one (NCHW, through copies) alike, so that the two give the same bits.
bool runs_direct8(dt t, const ConvGeom& g) {
  return t == dt::f32 && convs_take_nchw8c() && direct3x3_f32x8_serves(g);
}
bool runs_direct(dt t, const ConvGeom& g) {
  return runs_direct8(t, g) ||
         (t == dt::f32 && !g.nhwc && !winograd_fits(Kind::fwd, t, g) && direct3x3_f32_serves(g));
}

// The forward pass or input gradient through direct3x3_f32, as run_wino.
void run_direct(const ConvGeom& g, bool grad_input, const void* in_, const void* w, const void* bias,
                void* out_) {
  Shared& s = shared();
  std::lock_guard<std::mutex> lock(s.mu);
  const bool eight = runs_direct8(dt::f32, g);
  const Blocked copies = operands_of(g, grad_input, 4, eight ? 8 : 16);
  const auto* in = static_cast<const float*>(copies.operand(s.direct_copies, 0, in_, true));
  auto* out = static_cast<float*>(copies.operand(s.direct_copies, 1, out_, false));
  auto* v = static_cast<float*>(s.direct_weights.reserve(direct3x3_weight_bytes(g)));
  if (eight)
    direct3x3_f32x8_weights(g, grad_input, static_cast<const float*>(w), v);
  else
    direct3x3_f32_weights(g, grad_input, static_cast<const float*>(w), v);
  const int64_t items = direct3x3_items(g);
#pragma omp parallel num_threads(team_of(items))
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads(), i0 = t * items / nt,
                  i1 = (t + 1) * items / nt;
    if (eight)
      direct3x3_f32x8(g, grad_input, in, v, static_cast<const float*>(bias), out, i0, i1);
    else
      direct3x3_f32(g, grad_input, in, v, static_cast<const float*>(bias), out, i0, i1);
  }
  copies.write_back(1, out, out_);
}

// Runs the cached primitive of (k, g) on the given buffers, in the order of build()'s ports.
void run(Kind k, dt t, const ConvGeom& g, std::initializer_list<const void*> bufs) {
  static std::map<Key, Entry> cache;
  Shared& s = shared();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = cache.find(key_of(k, t, g));
  if (it == cache.end()) it = cache.emplace(key_of(k, t, g), build(k, t, g)).first;
  run_entry(it->second, bufs, s.port_buf, s.scratch_buf, main_stream());
}

// The weight gradient is a sum over the batch, which oneDNN splits between its threads by a plan made for
// their count: its bits would change with train.threads, and the thread count could not adapt to a busy
// machine without changing results. So the batch is cut into fixed blocks (kWeightBlocks, or fewer of
// kMinBlock samples each for a small batch: each block costs a few oneDNN calls, and each call allocates a
// little inside oneDNN); each block's gradient is one call of a primitive built for one thread, the blocks
// spread over flowrun's threads (each with a slot of its own), each into an f32 partial of its own; the
// partials are added in block order. The bits are the same for any thread count; threads beyond the block
// count sit this op out. Blocks of at least 16 samples: a call's cost does not shrink with its batch, and
// ResNet-20's fp32 step (batch 64, 2 threads) took, with blocks of 4, 8, 16 and 32 samples, 64.1 and 61.0 ms
// (Zen 4), then 62.5-64.0, 60.4-60.8 and 56.8-57.8 ms (a Sapphire Rapids-class host, alternating runs; its
// bf16 step and the bench CNN's did not move). 32 would leave a batch of 64 two blocks, and so two threads,
// on a machine with more cores.
constexpr int64_t kWeightBlocks = 16, kMinBlock = 16;

struct Blocks {
  int64_t count, largest;
  int64_t begin(int64_t b, int64_t n) const { return b * n / count; }
};
Blocks blocks_of(const ConvGeom& g) {
  const int64_t count = std::clamp<int64_t>(g.n / kMinBlock, 1, kWeightBlocks);
  return {count, (g.n + count - 1) / count};
}

ConvGeom with_batch(ConvGeom g, int64_t n) {
  g.n = n;
  return g;
}

int weight_team(const Blocks& b) {
  return team_of(b.count);
}

// flowrun's own weight gradients: in bf16 Winograd's (wino3x3_bf16_wgrad) for the geometries it serves, else
// the direct wgrad3x3_bf16; in f32 direct3x3_f32_wgrad, or on AVX2 hosts wgrad_few_f32 over fewer than 8
// input channels and wgrad8_f32 over multiples of 8. All take the same fixed batch blocks into f32 partials
// added in block order.
struct OwnWeightGradient {
  bool blocked_only;           // reads dy and x in nChw16c only (Blocked copies the NCHW ones)
  size_t elem;                 // bytes of an activation element
  GrowBuffer Shared::*copies;  // the pool of those copies, and its name
  const char* copies_pool;
  const char* scratch_pool;  // the name of the per-thread scratch (a slot's repack buffer)
  size_t (*scratch_bytes)(const ConvGeom&);
  int64_t (*partial_elems)(const ConvGeom&);
  void (*run)(const ConvGeom&, int64_t, int64_t, const void*, const void*, float*, void*);
  void (*finish)(const ConvGeom&, const float*, int64_t, int64_t, void*);
};
const OwnWeightGradient* own_weight_gradient(dt t, const ConvGeom& g) {
  static const OwnWeightGradient
      wino = {true,
              2,
              &Shared::wino_copies,
              "bf16 Winograd nChw16c copies",
              "bf16 3x3 weight-gradient image buffers",
              wino3x3_bf16_wgrad_scratch_bytes,
              wino3x3_bf16_wgrad_partial_elems,
              [](const ConvGeom&g, int64_t n0, int64_t n1, const void*dy, const void*x, float*p, void*s) {
                wino3x3_bf16_wgrad(g, n0, n1, static_cast<const bf16*>(dy), static_cast<const bf16*>(x), p,
                                   s);
              },
              [](const ConvGeom&g, const float*p, int64_t count, int64_t stride, void*dw) {
                wino3x3_bf16_wgrad_finish(g, p, count, stride, static_cast<bf16*>(dw));
              }},
      direct = {false,
                2,
                nullptr,
                nullptr,
                "bf16 3x3 weight-gradient image buffers",
                wgrad3x3_bf16_scratch_bytes,
                wgrad3x3_bf16_partial_elems,
                [](const ConvGeom&g, int64_t n0, int64_t n1, const void*dy, const void*x, float*p, void*s) {
                  wgrad3x3_bf16(g, n0, n1, static_cast<const bf16*>(dy), static_cast<const bf16*>(x), p, s);
                },
                [](const ConvGeom&g, const float*p, int64_t count, int64_t stride, void*dw) {
                  wgrad3x3_bf16_finish(g, p, count, stride, static_cast<bf16*>(dw));
                }},
      direct_f32 = {
          true,
          4,
          &Shared::direct_copies,
          "f32 direct 3x3 blocked copies",
          nullptr,
          [](const ConvGeom&) { return size_t{0}; },
          direct3x3_f32_wgrad_partial_elems,
          [](const ConvGeom&g, int64_t n0, int64_t n1, const void*dy, const void*x, float*p, void*) {
            direct3x3_f32_wgrad(g, n0, n1, static_cast<const float*>(dy), static_cast<const float*>(x), p);
          },
          [](const ConvGeom&g, const float*p, int64_t count, int64_t stride, void*dw) {
            direct3x3_f32_wgrad_finish(g, p, count, stride, static_cast<float*>(dw));
          }},
      few_f32 = {false,
                 4,
                 nullptr,
                 nullptr,
                 "f32 few-channel weight-gradient image buffers",
                 wgrad_few_f32_scratch_bytes,
                 wgrad_few_f32_partial_elems,
                 [](const ConvGeom&g, int64_t n0, int64_t n1, const void*dy, const void*x, float*p, void*s) {
                   wgrad_few_f32(g, n0, n1, static_cast<const float*>(dy), static_cast<const float*>(x), p,
                                 s);
                 },
                 [](const ConvGeom&g, const float*p, int64_t count, int64_t stride, void*dw) {
                   wgrad_few_f32_finish(g, p, count, stride, static_cast<float*>(dw));
                 }},
      blocks8_f32 = {
          false,
          4,
          nullptr,
          nullptr,
          "f32 8-channel weight-gradient image buffers",
          wgrad8_f32_scratch_bytes,
          wgrad8_f32_partial_elems,
          [](const ConvGeom&g, int64_t n0, int64_t n1, const void*dy, const void*x, float*p, void*s) {
            wgrad8_f32(g, n0, n1, static_cast<const float*>(dy), static_cast<const float*>(x), p, s);
          },
          [](const ConvGeom&g, const float*p, int64_t count, int64_t stride, void*dw) {
            wgrad_few_f32_finish(g, p, count, stride, static_cast<float*>(dw));
          }};
  // f32 over fewer than 8 input channels where oneDNN's kernels are its AVX2 ones, whatever the layout (an
  // eager step's NCHW gives the bits of a blocked one): wgrad_few_f32 took the bench CNN's first layer's
  // gradient (1 channel, 28 x 28, 32 filters, 64 images, dy in nChw8c) from 2.28 to 0.38 ms on Zen 3, 2
  // threads (flowrun_bench conv2d_grad_weight/cnn_nChw8c_64x1x28x28_k3x32, best of 3 alternating: 12.7 and
  // 75.7 GFLOP/s; conv_wgrad_few_f32.h).
  if (t == dt::f32 && convs_take_nchw8c() && wgrad_few_f32_fits(g)) return &few_f32;
  // Likewise over input channels in multiples of 8 with rows of 3 taps (conv_wgrad8_f32.h), in any layout:
  // 2 threads on Zen 3, x and dy in nChw8c, best of 3 alternating runs of flowrun_bench, oneDNN against
  // wgrad8_f32 in GFLOP/s: the bench CNN's second layer (32 -> 64 channels, 14 x 14) 123 -> 155, ResNet-20's
  // 16 channels on 32 x 32 129 -> 152, 64 on 8 x 8 134 -> 156, 16 -> 32 at stride 2 128 -> 134. In the
  // profiled steps the weight gradients went from 124 to 156 GFLOP/s (CNN) and 100 to 142 (ResNet-20).
  if (t == dt::f32 && convs_take_nchw8c() && wgrad8_f32_fits(g)) return &blocks8_f32;
  if (g.nhwc) return nullptr;
  // In f32 below 64 channels (in or out): ResNet-20's weight gradients in cache (flowrun_bench, 2 threads,
  // alternating runs) took 0.89-0.94 ms against oneDNN's 0.95-0.96 with 16 channels on 32x32 planes,
  // 0.87-0.88 against 0.99-1.00 with 32 on 16x16, and 0.82 against 0.71-0.73 (oneDNN's Winograd) with 64
  // on 8x8; in the step the 32-channel ones went from 6.4-6.8 to 5.7 ms, the 16-channel ones did not move.
  // At stride 2 (ResNet-20's downsampling layers) 0.59-0.62 against 0.77-0.78 ms and 0.57 against 0.67-0.70
  // in the step.
  if (t == dt::f32) return direct3x3_f32_wgrad_serves(g) && std::min(g.c, g.o) < 64 ? &direct_f32 : nullptr;
  if (t != dt::bf16 || !own_bf16_convs()) return nullptr;
  if (wino3x3_bf16_serves(g)) return &wino;
  // wgrad3x3_bf16 reads NCHW or nChw16c in place and has no nChw8c copies (no host runs it in nChw8c).
  return wgrad3x3_bf16_serves(g) && !g.nchw8c ? &direct : nullptr;
}

// grad_weight through an OwnWeightGradient (its caller holds s.mu): the same blocks, each thread's scratch in
// its slot's repack buffer, the partials added in block order.
void grad_weight_own(const OwnWeightGradient& k, Shared& s, const ConvGeom& g, const void* dy, const void* x,
                     void* dw) {
  const Blocks bl = blocks_of(g);
  const int team = weight_team(bl);
  while (s.slots.size() < static_cast<size_t>(team)) s.slots.push_back(std::make_unique<Slot>());
  const int64_t pelems = k.partial_elems(g);
  float* partials = static_cast<float*>(s.partials.reserve(static_cast<size_t>(bl.count * pelems) * 4));
  const size_t scratch = k.scratch_bytes(g);
#pragma omp parallel for schedule(static) num_threads(team)
  for (int64_t b = 0; b < bl.count; ++b)
    k.run(g, bl.begin(b, g.n), bl.begin(b + 1, g.n), dy, x, partials + b * pelems,
          s.slots[static_cast<size_t>(omp_get_thread_num())]->repack.reserve(scratch));
  k.finish(g, partials, bl.count, pelems, dw);
}

void grad_weight(dt t, const ConvGeom& g, const void* dy, const void* x, void* dw) {
  Shared& s = shared();
  std::lock_guard<std::mutex> lock(s.mu);
  if (const OwnWeightGradient* own = own_weight_gradient(t, g)) {
    if (own->blocked_only) {
      const Blocked copies = operands_of(g, true, own->elem);
      dy = copies.operand(s.*own->copies, 0, dy, true);
      x = copies.operand(s.*own->copies, 1, x, true);
    }
    return grad_weight_own(*own, s, g, dy, x, dw);
  }
  const Blocks bl = blocks_of(g);
  const int team = weight_team(bl);
  const int64_t welems = g.o * g.kdim(), esize = t == dt::f32 ? 4 : 2;
  const int64_t x_stride = g.c * g.h * g.w * esize, y_stride = g.o * g.plane() * esize;
  std::vector<Entry*>& entry = s.block_entries;  // [slot][block]
  entry.assign(static_cast<size_t>(bl.count * team), nullptr);
  {
    const OneThread one;
    while (s.slots.size() < static_cast<size_t>(team)) s.slots.push_back(std::make_unique<Slot>());
    for (int slot = 0; slot < team; ++slot)
      for (int64_t b = 0; b < bl.count; ++b) {
        const ConvGeom gb = with_batch(g, bl.begin(b + 1, g.n) - bl.begin(b, g.n));
        auto& cache = s.slots[static_cast<size_t>(slot)]->cache;
        auto it = cache.find(key_of(Kind::bwd_weights, t, gb));
        if (it == cache.end())
          it = cache.emplace(key_of(Kind::bwd_weights, t, gb), build(Kind::bwd_weights, t, gb)).first;
        entry[static_cast<size_t>(slot * bl.count + b)] = &it->second;
      }
  }
  // Each block's partial is in the primitive's layout (one for every block size: oneDNN picks it from the
  // channels and the kernel), the partials are added elementwise in block order (the sums they would have
  // in OIHW), and the sum is reordered to OIHW once: a reorder per block cost 3% of a ResNet-20 step.
  const dnnl::memory::desc& layout = entry[0]->ports[2].user.get_desc();
  for (const Entry* e : entry)
    FR_CHECK(e->ports[2].user.get_desc() == layout, "conv2d_grad_weight: blocks of another weight layout");
  const int64_t pelems = static_cast<int64_t>(layout.get_size() / 4);
  float* partials = static_cast<float*>(
      s.partials.reserve(static_cast<size_t>(bl.count * pelems + (t == dt::f32 ? 0 : welems)) * 4));
  // A failed call is rethrown here: an exception must not leave an OpenMP region.
  std::exception_ptr failed;
#pragma omp parallel for schedule(static) num_threads(team)
  for (int64_t b = 0; b < bl.count; ++b) {
    const int slot = omp_get_thread_num();
    Slot& own = *s.slots[static_cast<size_t>(slot)];
    const int64_t first = bl.begin(b, g.n);
    try {
      run_entry(*entry[static_cast<size_t>(slot * bl.count + b)],
                {static_cast<const char*>(dy) + first * y_stride,
                 static_cast<const char*>(x) + first * x_stride, partials + b * pelems},
                own.port_buf, own.scratch_buf, own.stream);
    } catch (...) {
#pragma omp critical(flowrun_conv_weight_error)
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
  parallel_for(pelems, 4096, [&](int64_t begin, int64_t end) {
    float* sum = partials + begin;
    for (int64_t b = 1; b < bl.count; ++b) {
      const float* p = partials + b * pelems + begin;
      for (int64_t i = 0; i < end - begin; ++i) sum[i] += p[i];
    }
  });
  const Key key = key_of(Kind::bwd_weights, t, g);
  auto it = s.to_plain.find(key);
  if (it == s.to_plain.end()) {
    Shared::ToPlain r;
    r.from = dnnl::memory(layout, engine(), nullptr);
    r.to = dnnl::memory(wei_desc(g, dt::f32, false), engine(), nullptr);
    r.reorder = dnnl::reorder(r.from, r.to);
    r.args = {{DNNL_ARG_FROM, r.from.get()}, {DNNL_ARG_TO, r.to.get()}};
    it = s.to_plain.emplace(key, std::move(r)).first;
  }
  float* plain = t == dt::f32 ? static_cast<float*>(dw) : partials + bl.count * pelems;
  it->second.from.set_data_handle(partials);
  it->second.to.set_data_handle(plain);
  execute(it->second.reorder, main_stream(), it->second.args);
  main_stream().wait();
  if (t != dt::f32)
    parallel_for(welems, 4096, [&](int64_t begin, int64_t end) {
      bf16* out = static_cast<bf16*>(dw);
      for (int64_t i = begin; i < end; ++i) out[i] = float_to_bf16(plain[i]);
    });
}

dt dnnl_type(DType t) {
  FR_CHECK(t == DType::f32 || t == DType::bf16, "oneDNN convolution: unsupported dtype ", dtype_name(t));
  return t == DType::f32 ? dt::f32 : dt::bf16;
}

}  // namespace

namespace {

// The bf16 weight gradient of a patch embedding (kernel = stride, no padding: a ViT's) over fewer than
// kWidenedChannels input channels per group runs oneDNN's f32 kernel on f32 copies of dy and x and rounds its
// sum: oneDNN's bf16 kernel took a 7x7 patch embedding of one channel 15 times as long as f32 (1.8 ms against
// 0.12; the bf16 ViT step 0.89x with the copies). The bench CNN's and ResNet's first 3x3 layers (1 and 3
// channels) ran slower that way (steps 1.07x and 1.02x) and stay bf16. The choice rests on the geometry
// alone, not on the layouts, so that an eager program (NCHW throughout) computes what the compiled one does.
// Not where flowrun's own bf16 3x3 kernel serves. (Intel AMX host, 2026-12-06.)
constexpr int64_t kWidenedChannels = 4;

bool widens_grad_weight(dt t, const ConvGeom& g) {
  const bool patches = g.kh == g.sh && g.kw == g.sw && g.ph == 0 && g.pw == 0 && g.dh == 1 && g.dw == 1;
  return t == dt::bf16 && patches && g.cg() < kWidenedChannels && !own_weight_gradient(t, g);
}

// The elements of x and dy as the caller lays them out (a blocked layout may pad the channels), and of dw.
struct WidenedSizes {
  int64_t x, y, w;
  explicit WidenedSizes(const ConvGeom& g) {
    const tag blocked = blocked_tag(g);
    x = static_cast<int64_t>(src_desc(g, dt::bf16, g.x_blocked ? blocked : tag::nchw).get_size() / 2);
    y = static_cast<int64_t>(dst_desc(g, dt::bf16, g.y_blocked ? blocked : tag::nchw).get_size() / 2);
    w = g.o * g.kdim();
  }
  size_t bytes() const { return static_cast<size_t>(x + y + w) * sizeof(float); }
};

// The f32 copies, with their own lock: grad_weight takes Shared's.
struct Widened {
  GrowBuffer buf;
  std::mutex mu;
};
Widened& widened() {
  static Widened w;
  return w;
}

}  // namespace

std::vector<std::pair<std::string, size_t>> dnnl_conv2d_buffers(DType t, const ConvGeom& g, ConvPass pass,
                                                                bool bias) {
  if (pass == ConvPass::grad_weight && widens_grad_weight(dnnl_type(t), g)) {
    std::vector<std::pair<std::string, size_t>> out = dnnl_conv2d_buffers(DType::f32, g, pass, bias);
    out.emplace_back("bf16 weight-gradient f32 copies", WidenedSizes(g).bytes());
    return out;
  }
  if (pass == ConvPass::grad_weight) {
    // A slot's pools per thread of the team, and the partials; a slot grows to the largest block.
    const Blocks bl = blocks_of(g);
    const size_t team = static_cast<size_t>(weight_team(bl));
    if (const OwnWeightGradient* own = own_weight_gradient(dnnl_type(t), g)) {
      std::vector<std::pair<std::string, size_t>> out = {
          {"convolution weight-gradient partials",
           static_cast<size_t>(bl.count * own->partial_elems(g)) * 4}};
      if (own->scratch_bytes(g) > 0) out.emplace_back(own->scratch_pool, team * own->scratch_bytes(g));
      const size_t copies = operands_of(g, true, own->elem).bytes();
      if (own->blocked_only && copies > 0) out.emplace_back(own->copies_pool, copies);
      return out;
    }
    const OneThread one;
    const Entry e = build(Kind::bwd_weights, dnnl_type(t), with_batch(g, bl.largest), false);
    const size_t plain = t == DType::f32 ? 0 : static_cast<size_t>(g.o * g.kdim()) * 4;
    std::vector<std::pair<std::string, size_t>> out = {
        {"oneDNN convolution weight-gradient scratchpads", team * e.scratch_bytes},
        {"convolution weight-gradient partials",
         static_cast<size_t>(bl.count) * e.ports[2].inner_bytes + plain}};
    for (size_t i = 0; i < e.ports.size(); ++i)
      if (e.ports[i].reordered)
        out.emplace_back(cat("oneDNN convolution weight-gradient reorder buffers ", i),
                         team * e.ports[i].inner_bytes);
    return out;
  }
  if (runs_wino(dnnl_type(t), g)) {
    std::vector<std::pair<std::string, size_t>> out = {
        {"bf16 Winograd weights", wino3x3_bf16_weight_bytes(g)},
        {"bf16 Winograd tile buffers", static_cast<size_t>(wino_team(g)) * wino3x3_bf16_scratch_bytes(g)}};
    const size_t copies = operands_of(g, pass == ConvPass::grad_input, 2).bytes();
    if (copies > 0) out.emplace_back("bf16 Winograd nChw16c copies", copies);
    return out;
  }
  if (runs_direct(dnnl_type(t), g)) {
    std::vector<std::pair<std::string, size_t>> out = {{"f32 direct 3x3 weights", direct3x3_weight_bytes(g)}};
    const size_t copies =
        operands_of(g, pass == ConvPass::grad_input, 4, runs_direct8(dnnl_type(t), g) ? 8 : 16).bytes();
    if (copies > 0) out.emplace_back("f32 direct 3x3 blocked copies", copies);
    return out;
  }
  const Kind k = pass == ConvPass::grad_input ? Kind::bwd_data : bias ? Kind::fwd_bias : Kind::fwd;
  const Entry e = build(k, dnnl_type(t), g, false);
  // The pools are run()'s shared buffers: port_buf[i] and scratch_buf.
  std::vector<std::pair<std::string, size_t>> out = {{"oneDNN convolution scratchpad", e.scratch_bytes}};
  for (size_t i = 0; i < e.ports.size(); ++i)
    if (e.ports[i].reordered)
      out.emplace_back(cat("oneDNN convolution reorder buffer ", i), e.ports[i].inner_bytes);
  return out;
}

size_t dnnl_conv2d_held_bytes() {
  size_t n = 0;
  {
    Widened& wide = widened();
    std::lock_guard<std::mutex> lock(wide.mu);
    n += wide.buf.size();
  }
  Shared& s = shared();
  std::lock_guard<std::mutex> lock(s.mu);
  n += s.scratch_buf.size() + s.partials.size() + s.wino_weights.size() + s.wino_copies.size() +
       s.direct_weights.size() + s.direct_copies.size();
  for (const GrowBuffer& b : s.port_buf) n += b.size();
  for (const auto& slot : s.slots) {
    n += slot->scratch_buf.size() + slot->repack.size() + slot->tiles.size();
    for (const GrowBuffer& b : slot->port_buf) n += b.size();
  }
  return n;
}

bool own_bf16_convs() {
  return own_convs().load(std::memory_order_relaxed);
}

void set_own_bf16_convs(bool on) {
  own_convs().store(on, std::memory_order_relaxed);
}

bool bf16_convs_take_nhwc() {
  return has_amx_bf16() && !own_bf16_convs();
}

bool convs_take_nchw8c() {
  static const bool eight = [] {
    ConvGeom g;
    g.n = 1;
    g.c = g.o = 16;
    g.h = g.w = g.oh = g.ow = 8;
    g.kh = g.kw = 3;
    g.ph = g.pw = 1;
    return fwd_pd(g, dt::f32, false, dnnl::algorithm::convolution_direct).src_desc() ==
           src_desc(g, dt::f32, tag::nChw8c);
  }();
  return eight;
}

void dnnl_conv2d(DType t, const ConvGeom& g, const void* x, const void* w, const void* bias, void* y) {
  if (runs_wino(dnnl_type(t), g)) return run_wino(g, false, x, w, bias, y);
  if (runs_direct(dnnl_type(t), g)) return run_direct(g, false, x, w, bias, y);
  if (bias)
    run(Kind::fwd_bias, dnnl_type(t), g, {x, w, y, bias});
  else
    run(Kind::fwd, dnnl_type(t), g, {x, w, y});
}

void dnnl_conv2d_grad_input(DType t, const ConvGeom& g, const void* dy, const void* w, void* dx) {
  if (runs_wino(dnnl_type(t), g)) return run_wino(g, true, dy, w, nullptr, dx);
  if (runs_direct(dnnl_type(t), g)) return run_direct(g, true, dy, w, nullptr, dx);
  run(Kind::bwd_data, dnnl_type(t), g, {dy, w, dx});
}

void dnnl_conv2d_grad_weight(DType t, const ConvGeom& g, const void* dy, const void* x, void* dw) {
  if (widens_grad_weight(dnnl_type(t), g)) {
    const WidenedSizes n(g);
    Widened& wide = widened();
    std::lock_guard<std::mutex> lock(wide.mu);
    float* fx = static_cast<float*>(wide.buf.reserve(n.bytes()));
    float *fy = fx + n.x, *fw = fy + n.y;
    convert(x, DType::bf16, fx, DType::f32, n.x);
    convert(dy, DType::bf16, fy, DType::f32, n.y);
    grad_weight(dt::f32, g, fy, fx, fw);
    convert(fw, DType::f32, dw, DType::bf16, n.w);
    return;
  }
  grad_weight(dnnl_type(t), g, dy, x, dw);
}

}  // namespace flowrun::cpu
