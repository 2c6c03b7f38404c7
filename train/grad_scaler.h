// Dynamic loss scaling for float16 training (PyTorch's GradScaler semantics), for GPUs without
// bf16. fp16 has 5 exponent bits: small gradients underflow to zero unless the loss is multiplied by
// a large factor before backward. Each step the gradients are divided by the scale again and
// checked; if any is inf or NaN the step is skipped and the scale halved, and after
// `growth_interval` good steps in a row it is doubled. Built on ATen's own kernels for this
// (_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_), which exist on CPU and CUDA.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace nanogpt::train {

class GradScaler {
 public:
  struct Options {
    double init_scale = 65536.0;  // 2^16, as PyTorch's
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    int64_t growth_interval = 2000;
  };

  /// A disabled scaler passes everything through (scale 1, every step taken).
  GradScaler(torch::Device device, bool enabled, Options options);
  GradScaler(torch::Device device, bool enabled) : GradScaler(device, enabled, Options{}) {}

  bool enabled() const { return enabled_; }

  /// loss * scale (loss itself when disabled).
  torch::Tensor scale(const torch::Tensor& loss) const;

  /// Divides the gradients by the scale in place and records whether any is inf or NaN.
  /// Call once per step, after the last backward and before clipping. Empty or undefined tensors
  /// are passed over; throws "[train] loss scaling: ..." when a gradient is on another device than
  /// the scale.
  void unscale(const std::vector<torch::Tensor>& grads);

  /// Whether the gradients unscaled last were all finite (one host sync). True when disabled.
  bool step_ok() const;
  /// The flag unscale() wrote: (1,) float32 on the device, 1 when a gradient was inf or NaN. The
  /// fused optimizer step reads it on the device (its found_inf), so skipping costs no host sync.
  const torch::Tensor& found_inf() const { return found_inf_; }

  /// Adjusts the scale after the step: backoff on inf/NaN, growth after a run of good steps.
  void update();

  /// The state to checkpoint: the current scale and the count of good steps in a row.
  double current_scale() const;
  int64_t growth_tracker() const;
  /// Restores a checkpointed state. Throws "[ckpt] ..." for a scale that is not finite and positive.
  void restore(double scale, int64_t growth_tracker);

 private:
  bool enabled_;
  Options options_;
  torch::Tensor scale_;           // (1,) float32 on the device
  torch::Tensor growth_tracker_;  // (1,) int32 on the device
  torch::Tensor found_inf_;       // (1,) float32 on the device: 1 when the last unscale saw inf/NaN
};

}  // namespace nanogpt::train
