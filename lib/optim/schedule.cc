// Learning-rate schedules (optim/schedule.h): pure functions of the step.
#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace flowrun {
namespace {

// Step decay: gamma per completed step_size steps after warmup, or per milestone reached.
double step_factor(const ScheduleConfig& s, int64_t step) {
  if (!s.milestones.empty()) {
    const auto reached =
        std::count_if(s.milestones.begin(), s.milestones.end(), [&](int64_t m) { return m <= step; });
    return std::pow(s.gamma, static_cast<double>(reached));
  }
  if (s.step_size <= 0)
    throw input_error("schedule.step_size: the step schedule needs step_size > 0 or milestones");
  return std::pow(s.gamma, static_cast<double>((step - s.warmup_steps) / s.step_size));
}

// Progress through the post-warmup part of the run, in [0, 1].
double progress(const ScheduleConfig& s, int64_t step, int64_t total_steps) {
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - s.warmup_steps));
  return std::clamp(static_cast<double>(step - s.warmup_steps) / span, 0.0, 1.0);
}

}  // namespace

double scheduled_lr(const ScheduleConfig& s, double base_lr, int64_t step, int64_t total_steps) {
  if (step < s.warmup_steps)
    return base_lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  if (s.type == "constant") return base_lr;
  if (s.type == "step") return base_lr * step_factor(s, step);
  const double p = progress(s, step, total_steps);
  if (s.type == "cosine") return s.min_lr + (base_lr - s.min_lr) * 0.5 * (1 + std::cos(std::numbers::pi * p));
  if (s.type == "linear") return base_lr + (s.min_lr - base_lr) * p;
  throw input_error(cat("schedule.type: unknown schedule '", s.type, "' (constant, step, cosine, linear)"));
}

}  // namespace flowrun
