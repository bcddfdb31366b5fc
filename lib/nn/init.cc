// Initialisation schemes (pytorch, gpt2, kaiming) resolved per parameter, and filling tensors from the run
// seed with one RNG stream per parameter name.
#include <cmath>

#include "nn/loader.h"

namespace flowrun {

namespace nn {

namespace {

InitSpec spec(const std::string& kind, double a = 0.0, double b = 0.0) {
  return InitSpec{kind, a, b};
}

InitSpec fan_in_uniform(int64_t fan_in) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
  return spec("uniform", -bound, bound);
}

InitSpec resolve_one(const ParamInfo& p, const std::string& scheme, int blocks) {
  if (p.override_spec) return *p.override_spec;
  const bool gpt2 = scheme == "gpt2";
  switch (p.role) {
    case ParamInfo::gamma:
    case ParamInfo::running_var:
      return spec("ones");
    case ParamInfo::beta:
    case ParamInfo::running_mean:
    case ParamInfo::kv_cache:
      return spec("zeros");
    case ParamInfo::embedding:
    case ParamInfo::position:
      return spec("normal", 0.0, gpt2 ? 0.02 : 1.0);
    case ParamInfo::bias:
      return gpt2 ? spec("zeros") : fan_in_uniform(p.fan_in);
    case ParamInfo::weight:
      // GPT-2 scales the projections that write into the residual stream by 1/sqrt(2 * n_layer).
      if (gpt2) return spec("normal", 0.0, p.residual ? 0.02 / std::sqrt(2.0 * std::max(blocks, 1)) : 0.02);
      if (scheme == "kaiming" && p.conv)
        return spec("normal", 0.0, std::sqrt(2.0 / static_cast<double>(p.fan_out)));
      return fan_in_uniform(p.fan_in);
  }
  FR_CHECK(false, "unknown parameter role");
}

}  // namespace

std::map<std::string, InitSpec> resolve_init(const Ctx& ctx, const std::string& scheme) {
  std::map<std::string, InitSpec> out;
  for (const auto& [name, info] : ctx.params) out[name] = resolve_one(info, scheme, ctx.transformer_blocks);
  return out;
}

}  // namespace nn

namespace {

double draw(const InitSpec& s, const RngStream& r, uint64_t i, uint64_t n) {
  if (s.kind == "zeros") return 0.0;
  if (s.kind == "ones") return 1.0;
  if (s.kind == "uniform") return s.a + (s.b - s.a) * r.uniform(i);
  if (s.kind == "normal") return s.a + s.b * r.normal(i);
  FR_CHECK(s.kind == "trunc_normal", "unknown init kind '", s.kind, "'");
  // Redraw outside mean +- 2 std from further indices of the same stream (a pure function of i).
  for (uint64_t k = 0; k < 64; ++k) {
    const double z = r.normal(i + k * n);
    if (std::abs(z) <= 2.0) return s.a + s.b * z;
  }
  return s.a;
}

}  // namespace

void init_parameters(const std::map<std::string, InitSpec>& init, uint64_t seed,
                     const std::function<Tensor&(const std::string&)>& tensor) {
  for (const auto& [name, s] : init) {
    Tensor& t = tensor(name);
    float* p = t.data<float>();
    const uint64_t n = static_cast<uint64_t>(t.numel());
    const RngStream r{seed, name_stream(name)};
    for (uint64_t i = 0; i < n; ++i) p[i] = static_cast<float>(draw(s, r, i, n));
  }
}

}  // namespace flowrun
