// Learning rate at a step: linear warmup, then cosine decay to min_lr (nanoGPT's get_lr), or
// warmup-stable-decay (WSD): the peak held until the last decay_frac of lr_decay_iters, then a
// linear decay to min_lr. A pure function of the step, so a resumed run recomputes it exactly.
#pragma once

#include <cstdint>

namespace nanogpt::train {

struct LrSchedule {
  double learning_rate = 6e-4;   // peak, reached at the end of warmup
  double min_lr = 6e-5;          // floor, from lr_decay_iters on
  int64_t warmup_iters = 2000;   // linear ramp (step + 1) / (warmup_iters + 1)
  int64_t lr_decay_iters = 600000;
  bool decay = true;             // false: constant learning_rate
  bool wsd = false;              // warmup-stable-decay instead of cosine
  double decay_frac = 0.2;       // wsd: the share of lr_decay_iters spent decaying

  /// The learning rate for optimizer step `step` (0-based).
  double at(int64_t step) const;
};

}  // namespace nanogpt::train
