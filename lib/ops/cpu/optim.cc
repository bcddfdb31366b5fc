// Optimizer kernels: fused updates (one pass over each parameter, reading and writing its state in place),
// the global gradient norm, the clipping coefficient and gradient accumulation.
#include "ops/cpu/optim.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/cpu/parallel.h"
#include "parallel/comm.h"

namespace flowrun::cpu {
namespace {

constexpr int64_t kGrain = 1 << 14;

// The optional trailing `coef` input (clipping / accumulation average), 1 when absent.
double grad_coef(const KernelCtx& c, int index) {
  return c.num_in > index ? load_as_f64(c.in[index].data, c.in[index].dtype, 0) : 1.0;
}

// Sum of squares of x[b, e) in double.
template <typename T>
double sum_squares(const T* x, int64_t b, int64_t e) {
  double s = 0;
  for (int64_t i = b; i < e; ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}

}  // namespace

void sgd_update(const KernelCtx& c) {
  const double mom = c.attrs().f("momentum", 0), damp = c.attrs().f("dampening", 0),
               wd = c.attrs().f("weight_decay", 0);
  const bool nesterov = c.attrs().b("nesterov");
  const double coef = grad_coef(c, 4);
  if (!std::isfinite(coef)) return;  // a skipped step (the loss scaler found non-finite gradients)
  dispatch_float(c.in[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* p = c.in[0].as<T>();
    const T* g = c.in[1].as<T>();
    T* buf = c.in[2].as<T>();
    const T lr = static_cast<T>(load_as_f64(c.in[3].data, c.in[3].dtype, 0));
    const T m = T(mom), d = T(1 - damp), w = T(wd), k = T(coef);
    parallel_for(c.in[0].numel(), kGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        T gi = k * g[i] + w * p[i];
        if (mom != 0) {
          buf[i] = m * buf[i] + d * gi;
          gi = nesterov ? gi + m * buf[i] : buf[i];
        }
        p[i] -= lr * gi;
      }
    });
  });
}

void adamw_update(const KernelCtx& c) {
  const double beta1 = c.attrs().f("beta1"), beta2 = c.attrs().f("beta2"), eps = c.attrs().f("eps"),
               wd = c.attrs().f("weight_decay", 0);
  const bool decoupled = c.attrs().b("decoupled");
  const double lr = load_as_f64(c.in[4].data, c.in[4].dtype, 0), coef = grad_coef(c, 6);
  if (!std::isfinite(coef)) return;  // a skipped step (the loss scaler found non-finite gradients)
  const int64_t step = *c.in[5].as<int64_t>();
  FR_CHECK(step >= 1, "adamw_update (", c.node->name, "): opt/step must be >= 1, got ", step);
  // PyTorch's bias corrections, as Python floats (double) from the integer step.
  const double t = static_cast<double>(step);
  const double step_size = lr / (1 - std::pow(beta1, t)), bc2_sqrt = std::sqrt(1 - std::pow(beta2, t));
  dispatch_float(c.in[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* p = c.in[0].as<T>();
    const T* g = c.in[1].as<T>();
    T* m = c.in[2].as<T>();
    T* v = c.in[3].as<T>();
    const T b1 = T(beta1), b2 = T(beta2), e = T(eps), k = T(coef), ss = T(step_size), bc2 = T(bc2_sqrt);
    const T decay = decoupled ? T(1 - lr * wd) : T(1), l2 = decoupled ? T(0) : T(wd);
    parallel_for(c.in[0].numel(), kGrain, [&](int64_t s, int64_t end) {
      for (int64_t i = s; i < end; ++i) {
        const T gi = k * g[i] + l2 * p[i];
        p[i] *= decay;
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        p[i] -= ss * m[i] / (std::sqrt(v[i]) / bc2 + e);
      }
    });
  });
}

void global_norm(const KernelCtx& c) {
  // Partial sums over fixed blocks (in parallel), then added in block order: the same bits on any thread
  // count.
  double* partial = static_cast<double*>(c.workspace);
  int64_t nblocks = 0;
  for (int k = 0; k < c.num_in; ++k) {
    const TensorView& x = c.in[k];
    const int64_t n = x.numel(), blocks = (n + kNormBlock - 1) / kNormBlock;
    double* out = partial + nblocks;
    dispatch_float(x.dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      const T* d = x.as<T>();
      parallel_for(blocks, 1, [&](int64_t s, int64_t e) {
        for (int64_t b = s; b < e; ++b)
          out[b] = sum_squares(d, b * kNormBlock, std::min(n, (b + 1) * kNormBlock));
      });
    });
    nblocks += blocks;
  }
  // Inputs [0, split_inputs) are pieces of gradients split over the tensor axis: their squares are summed over
  // its ranks (in a fixed order: the same bits on every rank).
  const int64_t split_inputs = c.attrs().i("split_inputs", 0);
  double split_total = 0, total = 0;
  int64_t b = 0;
  for (int k = 0; k < c.num_in; ++k) {
    const int64_t blocks = (c.in[k].numel() + kNormBlock - 1) / kNormBlock;
    double& into = k < split_inputs ? split_total : total;
    for (int64_t e = b + blocks; b < e; ++b) into += partial[b];
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
