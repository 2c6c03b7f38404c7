// Warmup + cosine schedule (see lr_schedule.h).
#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace nanogpt::train {

double LrSchedule::at(int64_t step) const {
  if (!decay) return learning_rate;
  if (step < warmup_iters)
    return learning_rate * static_cast<double>(step + 1) / static_cast<double>(warmup_iters + 1);
  if (step > lr_decay_iters) return min_lr;
  if (wsd) {
    const double decay_start = static_cast<double>(lr_decay_iters) * (1.0 - decay_frac);
    if (step <= decay_start) return learning_rate;  // stable
    const double span = std::max(1.0, static_cast<double>(lr_decay_iters) - decay_start);
    const double ratio = std::min(1.0, (static_cast<double>(step) - decay_start) / span);  // 0 -> 1
    return learning_rate + ratio * (min_lr - learning_rate);
  }
  const double span = static_cast<double>(std::max<int64_t>(1, lr_decay_iters - warmup_iters));
  const double ratio = static_cast<double>(step - warmup_iters) / span;  // 0 -> 1
  const double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));              // 1 -> 0
  return min_lr + coeff * (learning_rate - min_lr);
}

}  // namespace nanogpt::train
