// Optimizer kernels: fused updates (one pass over each parameter, reading and writing its state in place),
// the global gradient norm, the clipping coefficient and gradient accumulation.
#include "ops/cpu/optim.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "ops/cpu/matmul.h"
#include "ops/cpu/parallel.h"
#include "parallel/comm.h"

namespace flowrun::cpu {
namespace {

constexpr int64_t kGrain = 1 << 14;

// The optional trailing `coef` input (clipping / accumulation average), 1 when absent.
double grad_coef(const KernelCtx& c, int index) {
  return c.num_in > index ? load_as_f64(c.in[index].data, c.in[index].dtype, 0) : 1.0;
}

// Sum of squares of x[b, e) in double: x[b + i] goes into running sum i mod 16 (two registers of them), and
// the 16 sums and the tail are added in order at the end. One running sum was a chain of dependent adds, 4
// cycles an element: 0.5 ms of a 23 ms ViT step.
template <typename T>
double sum_squares(const T* x, int64_t b, int64_t e) {
  constexpr int64_t kSums = 16;
  double sums[kSums] = {};
  int64_t i = b;
  for (; i + kSums <= e; i += kSums)
    for (int64_t l = 0; l < kSums; ++l)
      sums[l] += static_cast<double>(x[i + l]) * static_cast<double>(x[i + l]);
  double s = 0;
  for (double v : sums) s += v;
  for (; i < e; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}

}  // namespace

namespace {

// Whether this SGD step is the first (PyTorch then sets the momentum buffer to the gradient, undampened):
// read from the step input only where it matters, momentum with dampening (a zero buffer gives the same
// first step otherwise).
bool sgd_first_step(const KernelCtx& c, int step_index) {
  const Attrs& a = c.attrs();
  if (a.f("momentum", 0) == 0 || a.f("dampening", 0) == 0) return false;
  const int64_t step = *c.in[step_index].as<int64_t>();
  FR_CHECK(step >= 1, c.node->op, " (", c.node->name, "): opt/step must be >= 1, got ", step);
  return step == 1;
}

template <typename T>
struct SgdCoefs {
  T k, w, m, d, rate;
  bool decay, momentum, first, nesterov;
  // Plain momentum (no dampening or Nesterov) with weight decay adds the decay term to the momentum sum
  // last, buf = fma(w, p, fma(m, buf, g)), where PyTorch adds it to the gradient first: the same sum in
  // another order, so that sgd_product_update can give its bits (its GEMM rounds fma(m, buf, g) itself).
  bool decay_last;
};

// SGD's elements [s, e) (a function of its own so that the loop vectorizes, as adamw_range). The fused
// multiply-adds are written out, not left to the compiler's contraction, because sgd_product_update must
// give the same bits: its GEMM adds momentum * buf to each gradient in one rounding.
template <typename T>
void sgd_range(T* __restrict p, const T* __restrict g, T* __restrict buf, int64_t s, int64_t e,
               const SgdCoefs<T> c) {
  for (int64_t i = s; i < e; ++i) {
    T gi = c.k * g[i];
    if (c.decay && !c.decay_last) gi = std::fma(c.w, p[i], gi);
    if (c.momentum) {
      T b = c.first ? gi : std::fma(c.m, buf[i], c.d * gi);
      if (c.decay_last) b = std::fma(c.w, p[i], b);
      buf[i] = b;
      gi = c.nesterov ? std::fma(c.m, b, gi) : b;
    }
    p[i] = std::fma(-c.rate, gi, p[i]);
  }
}

// The end of sgd_range's plain momentum over [s, e), the momentum sum fma(m, buf, g) already in buf: the
// decay term (w = 0: none), then p -= rate * buf. For sgd_product_update.
template <typename T>
void descend_range(T* __restrict p, T* __restrict buf, int64_t s, int64_t e, const T w, const T rate) {
  const bool decay = w != T(0);
  for (int64_t i = s; i < e; ++i) {
    T b = buf[i];
    if (decay) buf[i] = b = std::fma(w, p[i], b);
    p[i] = std::fma(-rate, b, p[i]);
  }
}

// One parameter's SGD step, the learning rate and gradient coefficient given: the single and multi-tensor
// updates share it, so that they give the same bits.
void sgd_tensor(const Attrs& a, const TensorView& param, const TensorView& grad, const TensorView& buffer,
                double lr, bool first, double coef) {
  const double mom = a.f("momentum", 0), damp = a.f("dampening", 0), wd = a.f("weight_decay", 0);
  const bool nesterov = a.b("nesterov");
  dispatch_float(param.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* p = param.as<T>();
    const T* g = grad.as<T>();
    T* buf = buffer.as<T>();
    const T rate = static_cast<T>(lr);
    // (1 - dampening) in double, then rounded: 1 - T(dampening) would round twice.
    const T m = T(mom), d = T(1 - damp), w = T(wd), k = T(coef);
    const bool decay_last = wd != 0 && mom != 0 && damp == 0 && !nesterov;
    const SgdCoefs<T> co{k, w, m, d, rate, wd != 0, mom != 0, first, nesterov, decay_last};
    parallel_for(param.numel(), kGrain, [&](int64_t s, int64_t e) { sgd_range(p, g, buf, s, e, co); });
  });
}

// PyTorch's Adam bias corrections of a step, as Python floats (double) from the integer step.
struct AdamStep {
  double lr, step_size, bc2_sqrt;
};

AdamStep adam_step(const KernelCtx& c, int lr_index, int step_index) {
  const double lr = load_as_f64(c.in[lr_index].data, c.in[lr_index].dtype, 0);
  const int64_t step = *c.in[step_index].as<int64_t>();
  FR_CHECK(step >= 1, c.node->op, " (", c.node->name, "): opt/step must be >= 1, got ", step);
  const double t = static_cast<double>(step);
  return {lr, lr / (1 - std::pow(c.attrs().f("beta1"), t)), std::sqrt(1 - std::pow(c.attrs().f("beta2"), t))};
}

template <typename T>
struct AdamCoefs {
  T k, l2, decay, b1, c1, b2, c2, ss, bc2, e;
};

// Adam's elements [s, e): a function of its own, with restrict pointers and the coefficients by value, so
// that the loop vectorizes (through a lambda's captured references every store could change them).
template <typename T>
void adamw_range(T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v, int64_t s,
                 int64_t e, const AdamCoefs<T> c) {
  for (int64_t i = s; i < e; ++i) {
    const T gi = c.k * g[i] + c.l2 * p[i];
    const T mi = c.b1 * m[i] + c.c1 * gi, vi = c.b2 * v[i] + c.c2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * c.decay - c.ss * mi / (std::sqrt(vi) / c.bc2 + c.e);
  }
}

// One parameter's Adam/AdamW step (shared by the single and multi-tensor updates, as sgd_tensor).
void adamw_tensor(const Attrs& a, const TensorView& param, const TensorView& grad, const TensorView& m1,
                  const TensorView& m2, const AdamStep& st, double coef) {
  const double beta1 = a.f("beta1"), beta2 = a.f("beta2"), eps = a.f("eps"), wd = a.f("weight_decay", 0);
  const bool decoupled = a.b("decoupled");
  dispatch_float(param.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* p = param.as<T>();
    const T* g = grad.as<T>();
    T* m = m1.as<T>();
    T* v = m2.as<T>();
    const T b1 = T(beta1), b2 = T(beta2), e = T(eps), k = T(coef), ss = T(st.step_size), bc2 = T(st.bc2_sqrt);
    // (1 - beta) in double, then rounded, as PyTorch's Python floats: 1 - T(beta) rounds twice (in f32,
    // 1 - float(0.999) is 0.000999987 against float(0.001) = 0.001).
    const T c1 = T(1 - beta1), c2 = T(1 - beta2);
    const T decay = decoupled ? T(1 - st.lr * wd) : T(1), l2 = decoupled ? T(0) : T(wd);
    const AdamCoefs<T> co{k, l2, decay, b1, c1, b2, c2, ss, bc2, e};
    parallel_for(param.numel(), kGrain, [&](int64_t s, int64_t end) { adamw_range(p, g, m, v, s, end, co); });
  });
}

}  // namespace

void sgd_update(const KernelCtx& c) {
  const double coef = grad_coef(c, 5);
  if (!std::isfinite(coef)) return;  // a skipped step (the loss scaler found non-finite gradients)
  sgd_tensor(c.attrs(), c.in[0], c.in[1], c.in[2], load_as_f64(c.in[3].data, c.in[3].dtype, 0),
             sgd_first_step(c, 4), coef);
}

// Inputs (param, a, b, momentum buffer, lr): buf = op(a) op(b) + momentum * buf, the GEMM adding the
// momentum term within its one rounding of each sum, then buf += weight_decay * p and p -= lr * buf. The
// bits of matmul then sgd_update (no dampening, Nesterov or coef) where gemm_fuses_beta holds, the only
// products the pass that makes this op fuses (elsewhere, as below AVX-512, the GEMM rounds buf * momentum
// first); the gradient is neither written nor read back.
void sgd_product_update(const KernelCtx& c) {
  const Attrs& a = c.attrs();
  const bool ta = a.b("trans_a"), tb = a.b("trans_b");
  const TensorView &p = c.in[0], &x = c.in[1], &y = c.in[2], &buf = c.in[3];
  const int64_t m = p.dim(0), n = p.dim(1), k = ta ? x.dim(0) : x.dim(1);
  const double lr = load_as_f64(c.in[4].data, c.in[4].dtype, 0);
  dispatch_float(p.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    gemm<T>(ta, tb, m, n, k, T(1), x.as<T>(), y.as<T>(), T(a.f("momentum")), buf.as<T>());
    T* pp = p.as<T>();
    T* b = buf.as<T>();
    const T w = T(a.f("weight_decay", 0)), rate = static_cast<T>(lr);
    parallel_for(p.numel(), kGrain, [&](int64_t s, int64_t e) { descend_range(pp, b, s, e, w, rate); });
  });
}

void adamw_update(const KernelCtx& c) {
  const double coef = grad_coef(c, 6);
  if (!std::isfinite(coef)) return;  // a skipped step (the loss scaler found non-finite gradients)
  adamw_tensor(c.attrs(), c.in[0], c.in[1], c.in[2], c.in[3], adam_step(c, 4, 5), coef);
}

// Inputs: the n = attr tensors parameters, their gradients and momentum buffers, lr, step [, coef].
void sgd_update_multi(const KernelCtx& c) {
  const int n = static_cast<int>(c.attrs().i("tensors"));
  const double coef = grad_coef(c, 3 * n + 2);
  if (!std::isfinite(coef)) return;
  const double lr = load_as_f64(c.in[3 * n].data, c.in[3 * n].dtype, 0);
  const bool first = sgd_first_step(c, 3 * n + 1);
  for (int k = 0; k < n; ++k) sgd_tensor(c.attrs(), c.in[k], c.in[n + k], c.in[2 * n + k], lr, first, coef);
}

// Inputs: the n = attr tensors parameters, gradients, first and second moments, lr, step [, coef].
void adamw_update_multi(const KernelCtx& c) {
  const int n = static_cast<int>(c.attrs().i("tensors"));
  const double coef = grad_coef(c, 4 * n + 2);
  if (!std::isfinite(coef)) return;
  const AdamStep st = adam_step(c, 4 * n, 4 * n + 1);
  for (int k = 0; k < n; ++k)
    adamw_tensor(c.attrs(), c.in[k], c.in[n + k], c.in[2 * n + k], c.in[3 * n + k], st, coef);
}

void global_norm(const KernelCtx& c) {
  // Partial sums over fixed blocks, then added in block order: the same bits on any thread count. The blocks
  // of every input are one parallel loop: a model's many small tensors (one block each) ran one at a time on
  // one thread when each input had a loop of its own.
  double* partial = static_cast<double*>(c.workspace);
  auto blocks_of = [&](int k) { return (c.in[k].numel() + kNormBlock - 1) / kNormBlock; };
  int64_t nblocks = 0;
  for (int k = 0; k < c.num_in; ++k) nblocks += blocks_of(k);
  parallel_for(nblocks, 1, [&](int64_t s, int64_t e) {
    int k = 0;
    int64_t first = 0;  // input k's first block
    for (int64_t g = s; g < e; ++g) {
      while (g >= first + blocks_of(k)) first += blocks_of(k++);
      const TensorView& x = c.in[k];
      const int64_t n = x.numel(), b = g - first;
      dispatch_float(x.dtype, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        partial[g] = sum_squares(x.as<T>(), b * kNormBlock, std::min(n, (b + 1) * kNormBlock));
      });
    }
  });
  // Inputs [0, split_inputs) are pieces of gradients split over the tensor axis: their squares are summed over
  // its ranks (in a fixed order: the same bits on every rank).
  const int64_t split_inputs = c.attrs().i("split_inputs", 0);
  double split_total = 0, total = 0;
  int64_t b = 0;
  for (int k = 0; k < c.num_in; ++k) {
    double& into = k < split_inputs ? split_total : total;
    for (int64_t e = b + blocks_of(k); b < e; ++b) into += partial[b];
  }
  if (split_inputs > 0 && c.tp) c.tp->all_reduce(&split_total, 1, DType::f64, ReduceOp::sum);
  total += split_total;
  if (c.attrs().b("data_sharded") && c.comm) c.comm->all_reduce(&total, 1, DType::f64, ReduceOp::sum);
  if (c.attrs().b("pipeline") && c.pp) c.pp->all_reduce(&total, 1, DType::f64, ReduceOp::sum);
  *c.out[0].as<float>() = static_cast<float>(c.attrs().f("scale", 1.0) * std::sqrt(total));
}

void clip_coef(const KernelCtx& c) {
  const double norm = load_as_f64(c.in[0].data, c.in[0].dtype, 0);
  const double clip = std::min(1.0, c.attrs().f("max_norm") / (norm + 1e-6));
  *c.out[0].as<float>() = static_cast<float>(c.attrs().f("scale", 1.0) * clip);
}

void unscale_coef(const KernelCtx& c) {
  const double norm = load_as_f64(c.in[0].data, c.in[0].dtype, 0);
  const double scale = load_as_f64(c.in[1].data, c.in[1].dtype, 0);
  const double max_norm = c.attrs().f("max_norm", 0.0);
  const double true_norm = norm / scale;
  double coef = std::numeric_limits<double>::quiet_NaN();
  if (std::isfinite(norm)) {
    coef = c.attrs().f("scale", 1.0) / scale;
    if (max_norm > 0) coef *= std::min(1.0, max_norm / (true_norm + 1e-6));
  }
  *c.out[0].as<float>() = static_cast<float>(coef);
  *c.out[1].as<float>() = static_cast<float>(true_norm);
}

void loss_scale_update(const KernelCtx& c) {
  const bool finite = std::isfinite(load_as_f64(c.in[0].data, c.in[0].dtype, 0));
  float& scale = *c.in[1].as<float>();
  int64_t& good = *c.in[2].as<int64_t>();
  int64_t& skipped = *c.in[3].as<int64_t>();
  const bool dynamic = c.attrs().b("dynamic", true);
  if (!finite) {
    ++skipped;
    if (dynamic) {
      scale = static_cast<float>(scale * c.attrs().f("backoff_factor", 0.5));
      good = 0;
    }
    return;
  }
  if (!dynamic) return;
  if (++good >= c.attrs().i("growth_interval", 2000)) {
    const float grown = static_cast<float>(scale * c.attrs().f("growth_factor", 2.0));
    if (std::isfinite(grown)) scale = grown;
    good = 0;
  }
}

void grad_accumulate(const KernelCtx& c) {
  const bool first = *c.in[2].as<int64_t>() == 0;
  dispatch_float(c.in[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* acc = c.in[0].as<T>();
    const T* g = c.in[1].as<T>();
    parallel_for(c.in[0].numel(), kGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) acc[i] = first ? g[i] : acc[i] + g[i];
    });
  });
}

}  // namespace flowrun::cpu
