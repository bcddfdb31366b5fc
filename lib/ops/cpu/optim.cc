// Fused optimizer updates: one pass over each parameter, reading and writing its state in place.
#include "ops/cpu/optim.h"

#include "ops/cpu/parallel.h"

namespace flowrun::cpu {

void sgd_update(const KernelCtx& c) {
  const double mom = c.attrs().f("momentum", 0), damp = c.attrs().f("dampening", 0),
               wd = c.attrs().f("weight_decay", 0);
  const bool nesterov = c.attrs().b("nesterov");
  dispatch_float(c.in[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* p = c.in[0].as<T>();
    const T* g = c.in[1].as<T>();
    T* buf = c.in[2].as<T>();
    const T lr = static_cast<T>(load_as_f64(c.in[3].data, c.in[3].dtype, 0));
    const T m = T(mom), d = T(1 - damp), w = T(wd);
    parallel_for(c.in[0].numel(), 1 << 14, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        T gi = g[i] + w * p[i];
        if (mom != 0) {
          buf[i] = m * buf[i] + d * gi;
          gi = nesterov ? gi + m * buf[i] : buf[i];
        }
        p[i] -= lr * gi;
      }
    });
  });
}

}  // namespace flowrun::cpu
