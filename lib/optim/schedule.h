// Learning-rate schedules: the lr of an optimizer step as a pure function of the step (0-based), so that a
// resumed run follows exactly the schedule of an uninterrupted one. Linear warmup from 0 over
// `warmup_steps`, then constant | step (gamma every step_size, or at milestones) | cosine (to min_lr at
// total_steps) | linear (to min_lr at total_steps), all PyTorch's formulas.
#pragma once

#include <cstdint>

#include "config/config.h"

namespace flowrun {

double scheduled_lr(const ScheduleConfig& s, double base_lr, int64_t step, int64_t total_steps);

}  // namespace flowrun
