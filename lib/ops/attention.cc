// Fused scaled-dot-product attention (sdpa) and its backward (sdpa_grad), and the rotary position embedding
// (rope); CPU kernels in ops/cpu/attention.cc and ops/cpu/rope.cc.
#include "ops/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <variant>

#include "graph/builder.h"
#include "ops/registry.h"

namespace flowrun {

namespace {

const std::vector<DType> kF = {DType::f32, DType::f64};

struct SdpaDims {
  int64_t b, h, t, s, d, dv;
};

// The saved log-sum-exp stays f32 under f16/bf16 inputs: the backward recomputes probabilities as
// exp(s - lse), and a bf16 lse of ~5 would be off by ~2%.
DType lse_dtype(DType t) {
  return is_low_precision(t) ? DType::f32 : t;
}

bool causal_of(const Attrs& a) {
  return a.b("causal", true);
}

// Validates q (B,H,T,D), k (B,H,S,D), v (B,H,S,Dv) and the attributes (the graph prefixes the op name).
SdpaDims check_qkv(const TensorType& q, const TensorType& k, const TensorType& v, const Attrs& a) {
  for (const TensorType* t : {&q, &k, &v})
    if (t->shape.size() != 4)
      throw input_error(cat("q, k and v must be (batch, heads, length, dim), got q ", shape_str(q.shape),
                            ", k ", shape_str(k.shape), ", v ", shape_str(v.shape)));
  if (!is_floating(q.dtype)) throw input_error(cat("q must be floating, got ", dtype_name(q.dtype)));
  if (k.dtype != q.dtype || v.dtype != q.dtype)
    throw input_error(cat("q, k and v dtypes differ (", dtype_name(q.dtype), ", ", dtype_name(k.dtype), ", ",
                          dtype_name(v.dtype), ")"));
  const SdpaDims d{q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3]};
  if (k.shape[0] != d.b || v.shape[0] != d.b || k.shape[1] != d.h || v.shape[1] != d.h)
    throw input_error(cat("batch and head dimensions of q ", shape_str(q.shape), ", k ", shape_str(k.shape),
                          " and v ", shape_str(v.shape), " differ"));
  if (k.shape[3] != d.d)
    throw input_error(cat("q and k head dims differ: ", shape_str(q.shape), " vs ", shape_str(k.shape)));
  if (v.shape[2] != d.s)
    throw input_error(cat("k and v lengths differ: ", shape_str(k.shape), " vs ", shape_str(v.shape)));
  if (d.t < 1 || d.s < 1 || d.d < 1 || d.dv < 1)
    throw input_error(cat("lengths and head dims must be positive, got q ", shape_str(q.shape), ", k ",
                          shape_str(k.shape), ", v ", shape_str(v.shape)));
  if (a.has("causal") && !std::holds_alternative<bool>(a.all().find("causal")->second))
    throw input_error("attribute 'causal' must be a bool");
  // Bottom-right aligned mask: query i sees keys j <= i + S - T, so a query longer than the keys would leave
  // its first rows with nothing to attend to.
  if (causal_of(a) && d.t > d.s)
    throw input_error(
        cat("causal attention needs at least as many keys as queries, got T = ", d.t, " > S = ", d.s));
  if (a.has("scale")) {
    const Attr& s = a.all().find("scale")->second;
    if (!std::holds_alternative<double>(s) && !std::holds_alternative<int64_t>(s))
      throw input_error("attribute 'scale' must be a number");
    if (!std::isfinite(a.f("scale"))) throw input_error("attribute 'scale' must be finite");
  }
  return d;
}

// The optional key padding mask: key_ids (B, S) i64 at input `at` (sdpa: 3, sdpa_grad: 6) with attr pad_id;
// true when it is there (the graph prefixes the op name).
bool check_key_ids(const std::vector<TensorType>& in, size_t at, const SdpaDims& d, const Attrs& a) {
  if (in.size() != at && in.size() != at + 1)
    throw input_error(cat("takes ", at, " inputs, or ", at + 1, " with key_ids, got ", in.size()));
  const bool masked = in.size() == at + 1;
  if (!masked) {
    if (a.has("pad_id")) throw input_error("attribute 'pad_id' needs the key_ids input");
    return false;
  }
  const TensorType& ids = in[at];
  if (ids.dtype != DType::i64 || ids.shape != Shape{d.b, d.s})
    throw input_error(cat("key_ids must be i64 (batch, keys) = ", shape_str(Shape{d.b, d.s}), ", got ",
                          shape_str(ids.shape), ":", dtype_name(ids.dtype)));
  if (!a.has("pad_id")) throw input_error("key_ids needs the attribute 'pad_id'");
  if (!std::holds_alternative<int64_t>(a.all().find("pad_id")->second))
    throw input_error("attribute 'pad_id' must be an integer");
  return true;
}

// Query-key pairs the softmax covers: all T*S, or under the causal mask sum_i min(S, i + S - T + 1).
double attended_pairs(const SdpaDims& d, bool causal) {
  const double t = static_cast<double>(d.t), s = static_cast<double>(d.s);
  const double per_head = causal ? t * (s - t) + t * (t + 1) / 2 : t * s;
  return static_cast<double>(d.b * d.h) * per_head;
}

double bytes_of(const std::vector<TensorType>& ts) {
  double n = 0;
  for (const auto& t : ts)
    n += static_cast<double>(numel(t.shape)) * static_cast<double>(dtype_size(t.dtype));
  return n;
}

// A backward's saved inputs: dout and out (input indices `dout_at`, `out_at`) of shape `out_shape`, lse
// (`lse_at`) of `lse_shape`, in the forward's dtype `t` (lse in lse_dtype(t)). The graph prefixes the op
// name.
void check_saved(const std::vector<TensorType>& in, size_t dout_at, size_t out_at, size_t lse_at,
                 const Shape& out_shape, const Shape& lse_shape, DType t) {
  if (in[dout_at].shape != out_shape || in[out_at].shape != out_shape)
    throw input_error(cat("dout ", shape_str(in[dout_at].shape), " and out ", shape_str(in[out_at].shape),
                          " must both be ", shape_str(out_shape)));
  if (in[lse_at].shape != lse_shape)
    throw input_error(cat("lse ", shape_str(in[lse_at].shape), " must be ", shape_str(lse_shape)));
  for (size_t i : {dout_at, out_at, lse_at}) {
    const DType want = i == lse_at ? lse_dtype(t) : t;
    if (in[i].dtype != want)
      throw input_error(cat("input ", i, " is ", dtype_name(in[i].dtype), ", expected ", dtype_name(want)));
  }
}

// The gradient of sdpa or sdpa_rows: `op`(dout, q, k, v, out, lse [, key_ids]) -> (dq, dk, dv); none for
// key_ids.
std::function<std::vector<ValueId>(GradCtx&)> sdpa_gradient(const std::string& op) {
  return [op](GradCtx& c) -> std::vector<ValueId> {
    std::vector<ValueId> ins = {c.dout(0), c.in(0), c.in(1), c.in(2), c.out(0), c.out(1)};
    const bool masked = c.node.inputs.size() == 4;
    if (masked) ins.push_back(c.in(3));
    const auto g = c.b.op(op, ins, c.attrs());
    std::vector<ValueId> grads = {g[0], g[1], g[2]};
    if (masked) grads.push_back(kNoValue);
    return grads;
  };
}

// Naive f64 attention: full score rows, mask, softmax, weighted sum; returns (out, lse).
std::vector<Tensor> sdpa_reference(const std::vector<Tensor>& in, const Attrs& a) {
  const Shape &qs = in[0].shape(), &ks = in[1].shape(), &vs = in[2].shape();
  const int64_t B = qs[0], H = qs[1], T = qs[2], D = qs[3], S = ks[2], Dv = vs[3];
  const bool causal = causal_of(a);
  const int64_t* key_ids = in.size() > 3 ? in[3].data<int64_t>() : nullptr;
  const int64_t pad = a.i("pad_id", 0);
  const double scale = a.f("scale", 1.0 / std::sqrt(static_cast<double>(D)));
  Tensor out = Tensor::zeros({B, H, T, Dv}, DType::f64), lse = Tensor::zeros({B, H, T}, DType::f64);
  const double *q = in[0].data<double>(), *k = in[1].data<double>(), *v = in[2].data<double>();
  double *o = out.data<double>(), *l = lse.data<double>();
  std::vector<double> w(static_cast<size_t>(S));
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i = 0; i < T; ++i) {
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < S; ++j) {
        const bool visible = (!causal || j <= i + (S - T)) && (!key_ids || key_ids[bh / H * S + j] != pad);
        double s = 0;
        for (int64_t p = 0; p < D; ++p) s += q[(bh * T + i) * D + p] * k[(bh * S + j) * D + p];
        w[static_cast<size_t>(j)] = visible ? s * scale : -std::numeric_limits<double>::infinity();
        mx = std::max(mx, w[static_cast<size_t>(j)]);
      }
      // A query that sees no key (all its keys padding): output 0, and lse 0 (finite, so that comparisons
      // and the backward's exp(s - lse) stay NaN-free; the backward skips every masked pair anyway).
      if (mx == -std::numeric_limits<double>::infinity()) continue;
      double sum = 0;
      for (double& x : w) sum += (x = std::exp(x - mx));
      for (int64_t j = 0; j < S; ++j)
        for (int64_t p = 0; p < Dv; ++p)
          o[(bh * T + i) * Dv + p] += w[static_cast<size_t>(j)] / sum * v[(bh * S + j) * Dv + p];
      l[bh * T + i] = mx + std::log(sum);
    }
  return {out, lse};
}

std::vector<OpSample> sdpa_samples() {
  struct Case {
    std::string label;
    Shape q, k, v;
    Attrs attrs;
  };
  const std::vector<Case> cases = {
      {"causal T=S=5", {2, 2, 5, 3}, {2, 2, 5, 3}, {2, 2, 5, 3}, Attrs{{"causal", true}}},
      {"full T=S=5", {2, 2, 5, 3}, {2, 2, 5, 3}, {2, 2, 5, 3}, Attrs{{"causal", false}}},
      {"causal T=3 S=6 (bottom-right)", {1, 2, 3, 4}, {1, 2, 6, 4}, {1, 2, 6, 4}, Attrs{{"causal", true}}},
      {"full T=4 S=7 Dv=5 scale=0.7",
       {2, 1, 4, 3},
       {2, 1, 7, 3},
       {2, 1, 7, 5},
       Attrs{{"causal", false}, {"scale", 0.7}}},
      {"causal Dv=2 scale=1.3",
       {1, 3, 6, 4},
       {1, 3, 6, 4},
       {1, 3, 6, 2},
       Attrs{{"causal", true}, {"scale", 1.3}}},
      // Several 64-row query and key blocks with ragged tails (diagonal blocks, row groups and vector tails),
      // default causal and scale, and head dims that are not a whole number of SIMD registers.
      {"causal multi-block T=70 S=75 D=66", {1, 1, 70, 66}, {1, 1, 75, 66}, {1, 1, 75, 5}, Attrs{}},
      {"full multi-block T=67 S=130 Dv=67",
       {1, 1, 67, 4},
       {1, 1, 130, 4},
       {1, 1, 130, 67},
       Attrs{{"causal", false}, {"scale", 2.0}}},
      // The CUDA kernels' tiles (16 to 64 rows): three query and key tiles with ragged last ones, the causal
      // mask skipping whole key tiles, and a query shorter than the keys over two heads.
      {"causal multi-tile T=S=150 D=24", {1, 1, 150, 24}, {1, 1, 150, 24}, {1, 1, 150, 24}, Attrs{}},
      {"full multi-tile T=S=150 D=24 Dv=20",
       {1, 1, 150, 24},
       {1, 1, 150, 24},
       {1, 1, 150, 20},
       Attrs{{"causal", false}}},
      {"causal multi-tile T=100 S=150", {1, 2, 100, 24}, {1, 2, 150, 24}, {1, 2, 150, 24}, Attrs{}},
      // Head dims of whole 16-lane registers: in f32 with AVX-512, k (and v) transposed in 16 x 16 register
      // blocks, here two of them and 8 rows left over.
      {"causal T=S=40 D=32", {1, 2, 40, 32}, {1, 2, 40, 32}, {1, 2, 40, 32}, Attrs{}},
  };
  std::vector<OpSample> s;
  for (const Case& c : cases) {
    OpSample o;
    o.label = c.label;
    o.inputs = {{c.q, DType::f64}, {c.k, DType::f64}, {c.v, DType::f64}};
    o.attrs = c.attrs;
    o.reference = sdpa_reference;
    s.push_back(o);
  }
  // Key padding (key_ids == pad_id hides a key from every query): a batch whose keys are all padding (its
  // rows 0, gradients 0), left padding under the causal mask (the first queries see nothing), right padding
  // and holes across the CPU's 64-key blocks and the CUDA tiles. `padded(b, j)` says which keys are padding.
  struct PadCase {
    std::string label;
    Shape q, k, v;
    Attrs attrs;
    std::function<bool(int64_t b, int64_t j)> padded;
  };
  const int64_t pad = 3;
  const std::vector<PadCase> pad_cases = {
      {"full key padding, batch 1 all padding",
       {2, 2, 5, 3},
       {2, 2, 6, 3},
       {2, 2, 6, 4},
       Attrs{{"causal", false}},
       [](int64_t b, int64_t j) { return b == 1 || j == 2 || j == 5; }},
      {"causal left padding (first rows see nothing), right padding",
       {2, 1, 7, 4},
       {2, 1, 7, 4},
       {2, 1, 7, 4},
       Attrs{{"causal", true}},
       [](int64_t b, int64_t j) { return b == 0 ? j < 3 : j >= 5; }},
      {"causal multi-block T=70 S=75 padding in both blocks",
       {1, 2, 70, 8},
       {1, 2, 75, 8},
       {1, 2, 75, 6},
       Attrs{},
       [](int64_t, int64_t j) { return j < 10 || j % 7 == 3 || j >= 70; }},
      {"full multi-tile T=S=150 D=24 right padding and holes",
       {2, 1, 150, 24},
       {2, 1, 150, 24},
       {2, 1, 150, 20},
       Attrs{{"causal", false}, {"scale", 0.5}},
       [](int64_t b, int64_t j) { return j >= 100 + 20 * b || (j >= 40 && j < 64 + 16 * b); }},
  };
  for (const PadCase& c : pad_cases) {
    OpSample o;
    o.label = c.label;
    o.inputs = {{c.q, DType::f64}, {c.k, DType::f64}, {c.v, DType::f64}, {{c.k[0], c.k[2]}, DType::i64}};
    o.attrs = c.attrs;
    o.attrs.set("pad_id", pad);
    const auto padded = c.padded;
    o.fill = [padded, pad](int i, Tensor& t, uint64_t seed) {
      std::vector<double> v(static_cast<size_t>(t.numel()));
      if (i < 3) {
        const RngStream r{seed, 1000 + static_cast<uint64_t>(i)};
        for (size_t e = 0; e < v.size(); ++e) v[e] = 2.0 * r.uniform(e) - 1.0;
      } else {
        const int64_t S = t.shape()[1];
        // Other ids around the pad id, so that only equality masks.
        for (size_t e = 0; e < v.size(); ++e) {
          const int64_t b = static_cast<int64_t>(e) / S, j = static_cast<int64_t>(e) % S;
          v[e] = static_cast<double>(padded(b, j) ? pad : (j % 2 ? pad + 1 : pad - 1));
        }
      }
      t.fill_from(v);
    };
    o.reference = sdpa_reference;
    s.push_back(o);
  }
  return s;
}

// ---- sdpa_qkv: sdpa over packed projections ----

// Attribute heads of sdpa_qkv and sdpa_rows, a positive integer (the graph prefixes the op name).
int64_t heads_attr(const Attrs& a) {
  if (!a.has("heads") || !std::holds_alternative<int64_t>(a.all().find("heads")->second) || a.i("heads") < 1)
    throw input_error("needs the attribute 'heads', a positive integer");
  return a.i("heads");
}

// The heads of qkv (B, T, 3 H D) under attr heads, as the (B, H, T, D) type of each of q, k and v (the
// graph prefixes the op name).
TensorType packed_heads(const TensorType& qkv, const Attrs& a) {
  if (qkv.shape.size() != 3)
    throw input_error(cat("qkv must be (batch, length, 3 * width), got ", shape_str(qkv.shape)));
  const int64_t h = heads_attr(a);
  if (qkv.shape[2] % (3 * h) != 0)
    throw input_error(cat("qkv's last dim ", qkv.shape[2], " is not 3 x heads (", h, ") x a head dim"));
  return {{qkv.shape[0], h, qkv.shape[1], qkv.shape[2] / (3 * h)}, qkv.dtype};
}

// x (B, L, H D) as (B, H, L, D) and back, in f64.
Tensor split_heads(const Tensor& x, int64_t h) {
  const Shape& s = x.shape();
  const int64_t B = s[0], L = s[1], D = s[2] / h;
  Tensor t = Tensor::zeros({B, h, L, D}, DType::f64);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < h; ++k)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t p = 0; p < D; ++p)
          t.data<double>()[((b * h + k) * L + i) * D + p] = x.data<double>()[(b * L + i) * h * D + k * D + p];
  return t;
}
Tensor merge_heads(const Tensor& t) {
  const Shape& s = t.shape();
  const int64_t B = s[0], h = s[1], L = s[2], D = s[3];
  Tensor x = Tensor::zeros({B, L, h * D}, DType::f64);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < h; ++k)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t p = 0; p < D; ++p)
          x.data<double>()[(b * L + i) * h * D + k * D + p] = t.data<double>()[((b * h + k) * L + i) * D + p];
  return x;
}

// f64 sdpa_qkv from sdpa_reference: q, k, v cut from the rows, the output's heads merged back.
std::vector<Tensor> sdpa_qkv_reference(const std::vector<Tensor>& in, const Attrs& a) {
  const Shape& xs = in[0].shape();
  const int64_t B = xs[0], T = xs[1], H = a.i("heads"), D = xs[2] / (3 * H), C = H * D;
  std::vector<Tensor> qkv;
  for (int part = 0; part < 3; ++part) {
    Tensor t = Tensor::zeros({B, H, T, D}, DType::f64);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < T; ++i)
          for (int64_t p = 0; p < D; ++p)
            t.data<double>()[((b * H + h) * T + i) * D + p] =
                in[0].data<double>()[(b * T + i) * 3 * C + part * C + h * D + p];
    qkv.push_back(t);
  }
  const std::vector<Tensor> r = sdpa_reference(qkv, a);
  return {merge_heads(r[0]), r[1]};
}

std::vector<OpSample> sdpa_qkv_samples() {
  struct Case {
    std::string label;
    Shape qkv;
    Attrs attrs;
  };
  // Two heads and a batch of two (the strided rows), several 64-row query and key blocks with ragged tails,
  // and head dims that are not a whole number of SIMD registers.
  const std::vector<Case> cases = {
      {"causal B=2 T=5 H=2 D=3", {2, 5, 18}, Attrs{{"heads", int64_t{2}}}},
      {"full B=2 T=5 H=3 D=2 scale=0.7",
       {2, 5, 18},
       Attrs{{"heads", int64_t{3}}, {"causal", false}, {"scale", 0.7}}},
      {"causal multi-block T=70 H=2 D=5", {1, 70, 30}, Attrs{{"heads", int64_t{2}}}},
      {"full multi-block T=130 H=1 D=17", {1, 130, 51}, Attrs{{"heads", int64_t{1}}, {"causal", false}}},
      // 16 x 16 register transposes of k and v (f32, AVX-512) from the packed rows, and 8 rows left over.
      {"causal B=2 T=40 H=2 D=16", {2, 40, 96}, Attrs{{"heads", int64_t{2}}}},
  };
  std::vector<OpSample> s;
  for (const Case& c : cases) {
    OpSample o;
    o.label = c.label;
    o.inputs = {{c.qkv, DType::f64}};
    o.attrs = c.attrs;
    o.reference = sdpa_qkv_reference;
    s.push_back(o);
  }
  return s;
}

// ---- sdpa_rows: sdpa over the projections' rows ----

// sdpa_rows' q (B, T, H D), k (B, S, H D), v (B, S, H Dv) at inputs [at, at + 3) under attr heads, validated
// as sdpa's heads (the graph prefixes the op name).
SdpaDims rows_dims(const std::vector<TensorType>& in, size_t at, const Attrs& a) {
  const int64_t h = heads_attr(a);
  auto heads = [&](const TensorType& t, const char* name) -> TensorType {
    if (t.shape.size() != 3 || t.shape[2] % h != 0)
      throw input_error(
          cat(name, " must be (batch, length, heads (", h, ") x head dim), got ", shape_str(t.shape)));
    return {{t.shape[0], h, t.shape[1], t.shape[2] / h}, t.dtype};
  };
  return check_qkv(heads(in[at], "q"), heads(in[at + 1], "k"), heads(in[at + 2], "v"), a);
}

// f64 sdpa_rows from sdpa_reference on the split heads.
std::vector<Tensor> sdpa_rows_reference(const std::vector<Tensor>& in, const Attrs& a) {
  const int64_t h = a.i("heads");
  std::vector<Tensor> heads = {split_heads(in[0], h), split_heads(in[1], h), split_heads(in[2], h)};
  if (in.size() > 3) heads.push_back(in[3]);
  const std::vector<Tensor> r = sdpa_reference(heads, a);
  return {merge_heads(r[0]), r[1]};
}

// sdpa's samples as rows (their heads merged), each with attr heads: every block, tail, mask and padding
// case.
std::vector<OpSample> sdpa_rows_samples() {
  std::vector<OpSample> s;
  for (OpSample o : sdpa_samples()) {
    const int64_t h = o.inputs[0].shape[1];
    for (size_t i = 0; i < 3; ++i) {
      const Shape& x = o.inputs[i].shape;
      o.inputs[i].shape = {x[0], x[2], x[1] * x[3]};
    }
    o.attrs.set("heads", h);
    o.reference = sdpa_rows_reference;
    s.push_back(o);
  }
  return s;
}

// ---- rope ----

// Largest position whose float32 value is exact (2^24): HF forms the positions in float32.
constexpr int64_t kRopeMaxPosition = int64_t{1} << 24;

struct RopeAttrs {
  double theta;
  bool inverse;
  int64_t offset;
};

// Validates x (B, H, T, D), the optional position input and the attributes (the graph prefixes the op name).
RopeAttrs check_rope(const std::vector<TensorType>& in, const Attrs& a) {
  if (in.size() != 1 && in.size() != 2)
    throw input_error(cat("takes x [, position], got ", in.size(), " inputs"));
  if (in.size() == 2 && (in[1].dtype != DType::i64 || in[1].shape != Shape{1}))
    throw input_error(
        cat("position must be i64 (1), got ", shape_str(in[1].shape), ":", dtype_name(in[1].dtype)));
  const TensorType& x = in[0];
  if (x.shape.size() != 4)
    throw input_error(cat("x must be (batch, heads, length, dim), got ", shape_str(x.shape)));
  if (!is_floating(x.dtype)) throw input_error(cat("x must be floating, got ", dtype_name(x.dtype)));
  if (x.shape[3] % 2 != 0 || x.shape[3] < 2)
    throw input_error(cat("the head dim must be even (rotated in pairs), got ", shape_str(x.shape)));
  RopeAttrs r{10000.0, false, 0};
  if (a.has("theta")) {
    const Attr& t = a.all().find("theta")->second;
    if (!std::holds_alternative<double>(t) && !std::holds_alternative<int64_t>(t))
      throw input_error("attribute 'theta' must be a number");
    r.theta = a.f("theta");
    // In float32, as HF: a base that rounds to 0 or inf there has no frequencies.
    const float tf = static_cast<float>(r.theta);
    if (!(r.theta > 0) || !std::isfinite(tf) || tf <= 0)
      throw input_error(cat("attribute 'theta' must be positive and finite in float32, got ", r.theta));
  }
  if (a.has("inverse")) {
    if (!std::holds_alternative<bool>(a.all().find("inverse")->second))
      throw input_error("attribute 'inverse' must be a bool");
    r.inverse = a.b("inverse");
  }
  if (a.has("offset")) {
    if (!std::holds_alternative<int64_t>(a.all().find("offset")->second))
      throw input_error("attribute 'offset' must be an integer");
    r.offset = a.i("offset");
  }
  if (r.offset < 0 || r.offset > kRopeMaxPosition - x.shape[2])
    throw input_error(
        cat("positions offset .. offset + T - 1 must lie in [0, 2^24) (exact in float32), got offset ",
            r.offset, " and T = ", x.shape[2]));
  return r;
}

// Straight from HF's formulas in f64 (cos/sin of rope_angle, rotate_half), one element at a time.
std::vector<Tensor> rope_reference(const std::vector<Tensor>& in, const Attrs& a) {
  std::vector<TensorType> types{{in[0].shape(), DType::f64}};
  if (in.size() == 2) types.push_back({in[1].shape(), DType::i64});
  RopeAttrs r = check_rope(types, a);
  if (in.size() == 2) r.offset += in[1].data<int64_t>()[0];
  const Shape& sh = in[0].shape();
  const int64_t L = sh[2], D = sh[3], half = D / 2;
  Tensor y = Tensor::zeros(sh, DType::f64);
  const double* x = in[0].data<double>();
  double* o = y.data<double>();
  for (int64_t row = 0; row < sh[0] * sh[1] * L; ++row) {
    const int64_t t = row % L;
    for (int64_t j = 0; j < D; ++j) {
      const int64_t i = j % half;
      const double angle =
          (r.inverse ? -1.0 : 1.0) * static_cast<double>(cpu::rope_angle(r.offset + t, i, D, r.theta));
      // rotate_half(x)[j] = -x[j + D/2] for j < D/2, x[j - D/2] after.
      const double rot = j < half ? -x[row * D + j + half] : x[row * D + j - half];
      o[row * D + j] = x[row * D + j] * std::cos(angle) + rot * std::sin(angle);
    }
  }
  return {y};
}

std::vector<OpSample> rope_samples() {
  struct Case {
    std::string label;
    Shape x;
    Attrs attrs;
  };
  const std::vector<Case> cases = {
      {"[2,3,5,4] defaults", {2, 3, 5, 4}, Attrs{}},
      {"[1,2,7,6] theta=500 offset=3", {1, 2, 7, 6}, Attrs{{"theta", 500.0}, {"offset", int64_t{3}}}},
      {"[2,1,4,8] inverse", {2, 1, 4, 8}, Attrs{{"inverse", true}}},
      {"[1,1,3,2] D=2 integer theta", {1, 1, 3, 2}, Attrs{{"theta", int64_t{100}}}},
      // A decode step far into the sequence (one position, large angles) and a Llama-sized head dim.
      {"[2,2,1,64] offset=1000 (decode)", {2, 2, 1, 64}, Attrs{{"offset", int64_t{1000}}}},
      {"[1,2,9,128] theta=500000 inverse offset=7",
       {1, 2, 9, 128},
       Attrs{{"theta", 500000.0}, {"inverse", true}, {"offset", int64_t{7}}}},
  };
  std::vector<OpSample> s;
  for (const Case& c : cases) {
    OpSample o;
    o.label = c.label;
    o.inputs = {{c.x, DType::f64}};
    o.attrs = c.attrs;
    o.reference = rope_reference;
    s.push_back(o);
  }
  // The position fed at run time, on top of the offset attribute: rows 0.. sit at 3 + 37 onwards.
  OpSample p = s[1];
  p.label = "[1,2,7,6] theta=500 offset=3 position input 37";
  p.inputs.push_back({{1}, DType::i64});
  p.fill = sample_fill({{1, 37}});
  s.push_back(p);
  return s;
}

// sdpa_cache's inputs: q (B,H,T,D), k (B,H,T,D), v (B,H,T,Dv), k_cache (B,H,L,D), v_cache (B,H,L,Dv),
// position (1) i64, one dtype for the floating ones (the graph prefixes the op name).
void check_cache(const std::vector<TensorType>& in, const Attrs& a) {
  if (in.size() != 6)
    throw input_error(cat("takes q, k, v, k_cache, v_cache, position, got ", in.size(), " inputs"));
  // Grouped-query attention: k and v (and the caches) may have fewer heads, each serving a group of query
  // heads (query head h reads key/value head h / (H / KV)), so the caches hold KV heads, not H.
  const int64_t KV = in[1].shape.size() == 4 ? in[1].shape[1] : 0;
  if (in[0].shape.size() == 4 && (KV < 1 || in[0].shape[1] % KV != 0))
    throw input_error(
        cat("k's heads must divide q's: q ", shape_str(in[0].shape), ", k ", shape_str(in[1].shape)));
  TensorType k_as_q = in[1], v_as_q = in[2];
  if (in[0].shape.size() == 4 && in[2].shape.size() == 4 && in[2].shape[1] == KV)
    k_as_q.shape[1] = v_as_q.shape[1] = in[0].shape[1];
  Attrs causal = a;
  causal.set("causal", false);  // the new keys are as many as the queries; the cache holds the rest
  const SdpaDims d = check_qkv(in[0], k_as_q, v_as_q, causal);
  const TensorType &kc = in[3], &vc = in[4];
  if (kc.dtype != in[0].dtype || vc.dtype != in[0].dtype)
    throw input_error(cat("the caches (", dtype_name(kc.dtype), ", ", dtype_name(vc.dtype), ") must be q's ",
                          dtype_name(in[0].dtype)));
  if (kc.shape.size() != 4 || vc.shape.size() != 4 || kc.shape[0] != d.b || kc.shape[1] != KV ||
      kc.shape[3] != d.d || vc.shape != Shape{d.b, KV, kc.shape[2], d.dv} || d.s != d.t)
    throw input_error(cat("k and v ", shape_str(in[1].shape), ", ", shape_str(in[2].shape),
                          " must be q's positions, and the caches (batch, heads, length, dim) of them, got ",
                          shape_str(kc.shape), ", ", shape_str(vc.shape)));
  if (kc.shape[2] < d.t)
    throw input_error(cat("the caches hold ", kc.shape[2], " positions, fewer than the ", d.t, " new ones"));
  if (in[5].dtype != DType::i64 || in[5].shape != Shape{1})
    throw input_error(
        cat("position must be i64 (1), got ", shape_str(in[5].shape), ":", dtype_name(in[5].dtype)));
}

// sdpa_cache in f64 from sdpa_reference: the caches with the new rows written at the position, then causal
// attention of the queries over the cache's first position + T keys (outputs: out, then the two caches).
std::vector<Tensor> sdpa_cache_reference(const std::vector<Tensor>& in, const Attrs& a) {
  const int64_t pos = in[5].data<int64_t>()[0];
  std::vector<Tensor> caches{in[3].clone(), in[4].clone()};
  const Shape& q = in[0].shape();
  const int64_t H = q[1], KV = in[1].shape()[1], BKV = q[0] * KV, T = q[2], L = in[3].shape()[2];
  for (int c = 0; c < 2; ++c) {
    const int64_t D = in[static_cast<size_t>(1 + c)].shape()[3];
    for (int64_t bk = 0; bk < BKV; ++bk)
      for (int64_t t = 0; t < T * D; ++t)
        caches[static_cast<size_t>(c)].data<double>()[(bk * L + pos) * D + t] =
            in[static_cast<size_t>(1 + c)].data<double>()[bk * T * D + t];
  }
  // The visible keys of every query head: its group's key/value head's first pos + T rows.
  auto window = [&](const Tensor& cache) {
    const int64_t D = cache.shape()[3], S = pos + T;
    Tensor w = Tensor::zeros({q[0], H, S, D}, DType::f64);
    for (int64_t bh = 0; bh < q[0] * H; ++bh) {
      const int64_t bk = bh / H * KV + bh % H / (H / KV);
      std::copy_n(cache.data<double>() + bk * L * D, S * D, w.data<double>() + bh * S * D);
    }
    return w;
  };
  Attrs causal = a;
  causal.set("causal", true);  // bottom-right aligned: query i sees keys j <= pos + i
  const Tensor out = sdpa_reference({in[0], window(caches[0]), window(caches[1])}, causal)[0];
  return {out, caches[0], caches[1]};
}

std::vector<OpSample> sdpa_cache_samples() {
  struct Case {
    std::string label;
    int64_t b, h, t, l, d, dv, pos, kv = 0;  // kv: key/value heads (0: h)
  };
  const std::vector<Case> cases = {
      {"prefill [2,3,5,4] into 8 at 0", 2, 3, 5, 8, 4, 4, 0},
      {"decode [2,2,1,4] at 6 of 8", 2, 2, 1, 8, 4, 3, 6},
      {"decode [1,2,1,8] at the last position", 1, 2, 1, 9, 8, 8, 8},
      {"chunk [1,1,3,2] at 2 of 7", 1, 1, 3, 7, 2, 5, 2},
      {"grouped: 6 query heads on 2 kv heads, prefill 4 into 7", 2, 6, 4, 7, 4, 4, 0, 2},
      {"grouped: 4 query heads on 1 kv head, decode at 5 of 7", 2, 4, 1, 7, 2, 3, 5, 1},
  };
  std::vector<OpSample> out;
  for (const Case& c : cases) {
    OpSample o;
    o.label = c.label;
    const int64_t kv = c.kv ? c.kv : c.h;
    o.inputs = {{{c.b, c.h, c.t, c.d}, DType::f64}, {{c.b, kv, c.t, c.d}, DType::f64},
                {{c.b, kv, c.t, c.dv}, DType::f64}, {{c.b, kv, c.l, c.d}, DType::f64},
                {{c.b, kv, c.l, c.dv}, DType::f64}, {{1}, DType::i64}};
    o.fill = sample_fill({{5, static_cast<double>(c.pos)}});
    o.reference = sdpa_cache_reference;
    o.gradcheck = false;
    out.push_back(o);
  }
  return out;
}

}  // namespace

void register_attention_ops(OpRegistry& r) {
  {
    // Autoregressive decoding with a key/value cache: each step computes k and v of its new positions only
    // and attends over everything cached so far, so a token costs one position, not the whole prefix.
    OpDef d;
    d.name = "sdpa_cache";
    d.doc =
        "causal attention with a key/value cache: q (B,H,T,D) and k, v (B,KV,T,D|Dv) of T new positions "
        "(KV dividing H: query head h reads key/value head h / (H/KV)), k_cache (B,KV,L,D) and v_cache "
        "(B,KV,L,Dv) (updated in place: k and v written at rows position.. position + "
        "T - 1), position (1) i64 (read at run time) -> out (B,H,T,Dv): query i attends over the cache's "
        "keys 0 .. position + i; attr scale (default 1/sqrt(D)). Not differentiable (inference programs)";
    d.num_inputs = 6;
    d.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
      check_cache(in, a);
      return {{{in[0].shape[0], in[0].shape[1], in[0].shape[2], in[2].shape[3]}, in[0].dtype}};
    };
    d.nondiff_inputs = {0, 1, 2, 3, 4, 5};
    d.mutates = {3, 4};
    d.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) -> Cost {
      // Every query against the whole cache at most (the position is known only when it runs).
      const Shape &q = in[0].shape, &kc = in[3].shape;
      const double pairs = static_cast<double>(q[0] * q[1] * q[2] * kc[2]);  // per query head
      return {pairs * (2.0 * static_cast<double>(q[3] + in[2].shape[3]) + 4.0),
              bytes_of({in[0], in[1], in[2], out[0]}) + bytes_of({in[3], in[4]})};
    };
    d.kernels = {{DeviceKind::cpu, kF, cpu::sdpa_cache}};
    d.samples = sdpa_cache_samples;
    r.add(d);
  }
  {
    OpDef d;
    d.name = "rope";
    d.doc =
        "rotary position embedding (Hugging Face's rotate_half, not interleaved pairs) of x (B,H,T,D), D "
        "even: y[i] = x[i] cos - x[i+D/2] sin, y[i+D/2] = x[i+D/2] cos + x[i] sin, angle = (offset + t) * "
        "theta^(-2i/D) formed in float32 as HF does; attrs theta (default 10000), inverse (bool, default "
        "false: rotates by -angle, the gradient), offset (int, default 0: the position of row t = 0); "
        "optional 2nd input position (1) i64, added to offset at run time (a KV-cache decode step's "
        "position)";
    d.num_inputs = -1;  // x, or x and position
    d.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
      check_rope(in, a);
      return {in[0]};
    };
    // A rotation's transpose is the rotation by the opposite angle (at the same positions).
    d.grad = [](GradCtx& c) -> std::vector<ValueId> {
      Attrs a = c.attrs();
      a.set("inverse", !a.b("inverse", false));
      std::vector<ValueId> in{c.dout(0)};
      if (c.node.inputs.size() == 2) in.push_back(c.in(1));
      std::vector<ValueId> grads{c.b.op1("rope", in, a)};
      if (c.node.inputs.size() == 2) grads.push_back(kNoValue);
      return grads;
    };
    d.nondiff_inputs = {1};
    d.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) -> Cost {
      // Two products and a sum per element; the T x D/2 cos/sin pairs are shared by the batch and heads.
      return {3.0 * static_cast<double>(numel(in[0].shape)), bytes_of(in) + bytes_of(out)};
    };
    // The CPU kernel's cos/sin table: T x D of its compute type (f32 for bf16).
    d.workspace = [](const std::vector<TensorType>& in, const std::vector<TensorType>&,
                     const Attrs&) -> size_t {
      return static_cast<size_t>(in[0].shape[2] * in[0].shape[3]) *
             (in[0].dtype == DType::f64 ? sizeof(double) : sizeof(float));
    };
    d.inplace_input = 0;
    // The batch (data parallel) or the heads (tensor parallel) split: rows are rotated independently, by
    // their position along T, which stays whole.
    d.sbp = [](const SbpQuery&) {
      std::vector<SbpSignature> sigs;
      for (int a : {1, 0}) sigs.push_back({{Sbp::split(a)}, {Sbp::split(a)}});
      return sigs;
    };
    d.kernels = {{DeviceKind::cpu, {DType::f32, DType::f64, DType::bf16}, cpu::rope}};
    d.samples = rope_samples;
    r.add(d);
  }

  OpDef d;
  d.name = "sdpa";
  d.doc =
      "scaled-dot-product attention softmax(scale * q k^T [+ causal mask]) v over q (B,H,T,D), k (B,H,S,D), "
      "v (B,H,S,Dv) -> out (B,H,T,Dv), lse (B,H,T) (log-sum-exp of each scaled score row, saved for the "
      "backward); attrs causal (bool, default true; query i sees keys j <= i + S - T), scale (default "
      "1/sqrt(D)); optional 4th input key_ids (B,S) i64 with attr pad_id: key j of batch b is hidden from "
      "every query where key_ids[b,j] == pad_id (a query that sees no key gives 0, with lse 0)";
  d.num_inputs = -1;  // 3, or 4 with key_ids
  d.num_outputs = [](const Attrs&) { return 2; };
  d.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    if (in.size() < 3) throw input_error(cat("takes q, k, v [, key_ids], got ", in.size(), " inputs"));
    const SdpaDims s = check_qkv(in[0], in[1], in[2], a);
    check_key_ids(in, 3, s, a);
    return {{{s.b, s.h, s.t, s.dv}, in[0].dtype}, {{s.b, s.h, s.t}, lse_dtype(in[0].dtype)}};
  };
  d.grad = sdpa_gradient("sdpa_grad");
  d.nondiff_inputs = {3};
  d.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& a) -> Cost {
    const SdpaDims s = check_qkv(in[0], in[1], in[2], a);
    const double pairs = attended_pairs(s, causal_of(a));
    // q k^T and p v, plus ~4 flops per score for scaling, max, exp and sum.
    return {pairs * (2.0 * static_cast<double>(s.d + s.dv) + 4.0), bytes_of(in) + bytes_of(out)};
  };
  // scale * k^T, one (D x S) slice per (batch, head).
  d.workspace = [](const std::vector<TensorType>& in, const std::vector<TensorType>&,
                   const Attrs&) -> size_t {
    return static_cast<size_t>(numel(in[1].shape)) * dtype_size(in[1].dtype);
  };
  d.nondiff_outputs = {1};
  // Heads (tensor parallel) or the batch (data parallel) split: each rank attends over its own; key_ids
  // (per batch row, for every head) whole under the first, split with the batch under the second.
  d.sbp = [](const SbpQuery& q) {
    std::vector<SbpSignature> sigs;
    for (int a : {1, 0}) {
      SbpSignature sig{{Sbp::split(a), Sbp::split(a), Sbp::split(a)}, {Sbp::split(a), Sbp::split(a)}};
      if (q.in.size() == 4) sig.in.push_back(a == 0 ? Sbp::split(0) : Sbp::broadcast());
      sigs.push_back(sig);
    }
    return sigs;
  };
  d.kernels = {{DeviceKind::cpu, kF, cpu::sdpa}};
#if defined(__AVX512BF16__)
  d.kernels.push_back({DeviceKind::cpu,
                       {DType::bf16},
                       cpu::sdpa_bf16,
                       cpu::bf16_attention_native,
                       cpu::sdpa_bf16_forward_workspace,
                       cpu::sdpa_bf16_buffers});
#endif
  d.samples = sdpa_samples;
  r.add(d);

  OpDef g;
  g.name = "sdpa_grad";
  g.doc =
      "gradient of sdpa: (dout, q, k, v, out, lse) -> (dq, dk, dv), probabilities recomputed from lse "
      "(FlashAttention-2 backward); attrs as sdpa, and its key_ids as an optional 7th input";
  g.num_inputs = -1;  // 6, or 7 with key_ids
  g.num_outputs = [](const Attrs&) { return 3; };
  g.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    if (in.size() < 6)
      throw input_error(cat("takes dout, q, k, v, out, lse [, key_ids], got ", in.size(), " inputs"));
    const SdpaDims s = check_qkv(in[1], in[2], in[3], a);
    check_key_ids(in, 6, s, a);
    check_saved(in, 0, 4, 5, {s.b, s.h, s.t, s.dv}, {s.b, s.h, s.t}, in[1].dtype);
    return {in[1], in[2], in[3]};
  };
  g.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& a) -> Cost {
    const SdpaDims s = check_qkv(in[1], in[2], in[3], a);
    const double pairs = attended_pairs(s, causal_of(a));
    // Recomputed q k^T, dout v^T, p^T dout, ds^T q and ds k.
    return {pairs * (2.0 * static_cast<double>(3 * s.d + 2 * s.dv) + 5.0), bytes_of(in) + bytes_of(out)};
  };
  // CPU: scale * k^T and v^T, one slice each per (batch, head); CUDA: rowsum(dout * out), an f32 per query.
  g.workspace = [](const std::vector<TensorType>& in, const std::vector<TensorType>&,
                   const Attrs&) -> size_t {
    return std::max(static_cast<size_t>(numel(in[2].shape) + numel(in[3].shape)) * dtype_size(in[2].dtype),
                    static_cast<size_t>(numel(in[5].shape)) * sizeof(float));
  };
  g.nondiff_inputs = {6};
  g.kernels = {{DeviceKind::cpu, kF, cpu::sdpa_grad}};
#if defined(__AVX512BF16__)
  g.kernels.push_back({DeviceKind::cpu,
                       {DType::bf16},
                       cpu::sdpa_grad_bf16,
                       cpu::bf16_attention_native,
                       cpu::sdpa_grad_bf16_workspace});
#endif
  g.covered_by = {"sdpa"};
  r.add(g);

  // The CPU fusion of split -> heads -> sdpa -> merge (graph/passes.cc): one op, no transposed copies.
  OpDef pq;
  pq.name = "sdpa_qkv";
  pq.doc =
      "sdpa over packed projections: qkv (B,T,3*H*D), each row q | k | v with heads (H,D) -> out (B,T,H*D) "
      "(heads merged), lse (B,H,T); attrs heads, causal, scale as sdpa. The CPU fusion of qkv's split, the "
      "heads' transposes, sdpa and the merge, with their bits";
  pq.num_outputs = [](const Attrs&) { return 2; };
  pq.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    const TensorType h = packed_heads(in[0], a);
    const SdpaDims s = check_qkv(h, h, h, a);
    return {{{s.b, s.t, s.h * s.d}, in[0].dtype}, {{s.b, s.h, s.t}, lse_dtype(in[0].dtype)}};
  };
  pq.grad = [](GradCtx& c) -> std::vector<ValueId> {
    return {c.b.op1("sdpa_qkv_grad", {c.dout(0), c.in(0), c.out(0), c.out(1)}, c.attrs())};
  };
  pq.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out,
               const Attrs& a) -> Cost {
    const TensorType h = packed_heads(in[0], a);
    const SdpaDims s = check_qkv(h, h, h, a);
    return {attended_pairs(s, causal_of(a)) * (4.0 * static_cast<double>(s.d) + 4.0),
            bytes_of(in) + bytes_of(out)};
  };
  // scale * k^T, one (D x T) slice per (batch, head).
  pq.workspace = [](const std::vector<TensorType>& in, const std::vector<TensorType>&,
                    const Attrs&) -> size_t {
    return static_cast<size_t>(numel(in[0].shape) / 3) * dtype_size(in[0].dtype);
  };
  pq.nondiff_outputs = {1};
  // The batch (data parallel) only: a split of the heads would cut each row's q, k and v apart.
  pq.sbp = [](const SbpQuery&) {
    return std::vector<SbpSignature>{{{Sbp::split(0)}, {Sbp::split(0), Sbp::split(0)}}};
  };
  pq.kernels = {{DeviceKind::cpu, kF, cpu::sdpa_qkv}};
#if defined(__AVX512BF16__)
  pq.kernels.push_back({DeviceKind::cpu,
                        {DType::bf16},
                        cpu::sdpa_qkv_bf16,
                        cpu::bf16_attention_native,
                        cpu::sdpa_bf16_forward_workspace,
                        cpu::sdpa_qkv_bf16_buffers});
#endif
  pq.samples = sdpa_qkv_samples;
  r.add(pq);

  OpDef pg;
  pg.name = "sdpa_qkv_grad";
  pg.doc =
      "gradient of sdpa_qkv: (dout, qkv, out, lse) -> dqkv (FlashAttention-2 backward); attrs as sdpa_qkv";
  pg.num_inputs = 4;
  pg.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    const TensorType h = packed_heads(in[1], a);
    const SdpaDims s = check_qkv(h, h, h, a);
    check_saved(in, 0, 2, 3, {s.b, s.t, s.h * s.d}, {s.b, s.h, s.t}, in[1].dtype);
    return {in[1]};
  };
  pg.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out,
               const Attrs& a) -> Cost {
    const TensorType h = packed_heads(in[1], a);
    const SdpaDims s = check_qkv(h, h, h, a);
    return {attended_pairs(s, causal_of(a)) * (10.0 * static_cast<double>(s.d) + 5.0),
            bytes_of(in) + bytes_of(out)};
  };
  // The CPU kernels' per-thread scratch (thread_scratch): the f32 one's transposed k and v of a head, the
  // bf16 one's head scratch.
  const auto per_thread = [](const std::vector<TensorType>& in, const std::vector<TensorType>&,
                             const Attrs& a) -> std::vector<std::pair<std::string, size_t>> {
    const TensorType h = packed_heads(in[1], a);
    const size_t head = static_cast<size_t>(h.shape[2] * h.shape[3]) * dtype_size(h.dtype);
    const size_t threads = static_cast<size_t>(std::max(1, omp_get_max_threads()));
    return {{cpu::kSdpaThreadBuffers, threads * head * cpu::kSdpaQkvGradBuffers}};
  };
  pg.kernels = {{DeviceKind::cpu, kF, cpu::sdpa_qkv_grad, nullptr, nullptr, per_thread}};
#if defined(__AVX512BF16__)
  pg.kernels.push_back({DeviceKind::cpu,
                        {DType::bf16},
                        cpu::sdpa_qkv_grad_bf16,
                        cpu::bf16_attention_native,
                        nullptr,
                        cpu::sdpa_qkv_bf16_buffers});
#endif
  pg.covered_by = {"sdpa_qkv"};
  r.add(pg);

  // The CPU fusion of separate projections' reshape -> transpose -> sdpa -> transpose -> reshape
  // (graph/passes.cc): one op reading and writing the rows in place.
  OpDef rw;
  rw.name = "sdpa_rows";
  rw.doc =
      "sdpa over the projections' rows: q (B,T,H*D), k (B,S,H*D), v (B,S,H*Dv) [, key_ids (B,S)] -> out "
      "(B,T,H*Dv) (heads merged), lse (B,H,T); attrs heads, causal, scale, pad_id as sdpa. The CPU fusion of "
      "the heads' transposes around sdpa, with its bits";
  rw.num_inputs = -1;  // 3, or 4 with key_ids
  rw.num_outputs = [](const Attrs&) { return 2; };
  rw.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    if (in.size() < 3) throw input_error(cat("takes q, k, v [, key_ids], got ", in.size(), " inputs"));
    const SdpaDims s = rows_dims(in, 0, a);
    check_key_ids(in, 3, s, a);
    return {{{s.b, s.t, s.h * s.dv}, in[0].dtype}, {{s.b, s.h, s.t}, lse_dtype(in[0].dtype)}};
  };
  rw.grad = sdpa_gradient("sdpa_rows_grad");
  rw.nondiff_inputs = {3};
  rw.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out,
               const Attrs& a) -> Cost {
    const SdpaDims s = rows_dims(in, 0, a);
    return {attended_pairs(s, causal_of(a)) * (2.0 * static_cast<double>(s.d + s.dv) + 4.0),
            bytes_of(in) + bytes_of(out)};
  };
  // scale * k^T, one (D x S) slice per (batch, head).
  rw.workspace = [](const std::vector<TensorType>& in, const std::vector<TensorType>&,
                    const Attrs&) -> size_t {
    return static_cast<size_t>(numel(in[1].shape)) * dtype_size(in[1].dtype);
  };
  rw.nondiff_outputs = {1};
  // The batch (data parallel) only, as sdpa_qkv: a split of the heads would cut each row apart.
  rw.sbp = [](const SbpQuery& q) {
    SbpSignature sig{std::vector<Sbp>(3, Sbp::split(0)), {Sbp::split(0), Sbp::split(0)}};
    if (q.in.size() == 4) sig.in.push_back(Sbp::split(0));
    return std::vector<SbpSignature>{sig};
  };
  rw.kernels = {{DeviceKind::cpu, kF, cpu::sdpa_rows}};
#if defined(__AVX512BF16__)
  rw.kernels.push_back({DeviceKind::cpu,
                        {DType::bf16},
                        cpu::sdpa_rows_bf16,
                        cpu::bf16_attention_native,
                        cpu::sdpa_bf16_forward_workspace,
                        cpu::sdpa_rows_bf16_buffers});
#endif
  rw.samples = sdpa_rows_samples;
  r.add(rw);

  OpDef rg;
  rg.name = "sdpa_rows_grad";
  rg.doc =
      "gradient of sdpa_rows: (dout, q, k, v, out, lse [, key_ids]) -> (dq, dk, dv) (FlashAttention-2 "
      "backward); attrs as sdpa_rows";
  rg.num_inputs = -1;  // 6, or 7 with key_ids
  rg.num_outputs = [](const Attrs&) { return 3; };
  rg.infer = [](const std::vector<TensorType>& in, const Attrs& a) -> std::vector<TensorType> {
    if (in.size() < 6)
      throw input_error(cat("takes dout, q, k, v, out, lse [, key_ids], got ", in.size(), " inputs"));
    const SdpaDims s = rows_dims(in, 1, a);
    check_key_ids(in, 6, s, a);
    check_saved(in, 0, 4, 5, {s.b, s.t, s.h * s.dv}, {s.b, s.h, s.t}, in[1].dtype);
    return {in[1], in[2], in[3]};
  };
  rg.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out,
               const Attrs& a) -> Cost {
    const SdpaDims s = rows_dims(in, 1, a);
    return {attended_pairs(s, causal_of(a)) * (2.0 * static_cast<double>(3 * s.d + 2 * s.dv) + 5.0),
            bytes_of(in) + bytes_of(out)};
  };
  // scale * k^T and v^T, one slice each per (batch, head).
  rg.workspace = [](const std::vector<TensorType>& in, const std::vector<TensorType>&,
                    const Attrs&) -> size_t {
    return static_cast<size_t>(numel(in[2].shape) + numel(in[3].shape)) * dtype_size(in[2].dtype);
  };
  rg.nondiff_inputs = {6};
  rg.kernels = {{DeviceKind::cpu, kF, cpu::sdpa_rows_grad}};
#if defined(__AVX512BF16__)
  rg.kernels.push_back({DeviceKind::cpu,
                        {DType::bf16},
                        cpu::sdpa_rows_grad_bf16,
                        cpu::bf16_attention_native,
                        cpu::sdpa_bf16_forward_workspace,
                        cpu::sdpa_rows_bf16_buffers});
#endif
  rg.covered_by = {"sdpa_rows"};
  r.add(rg);
}

}  // namespace flowrun
