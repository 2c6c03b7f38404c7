// Dynamic loss scaling (see grad_scaler.h).
#include "train/grad_scaler.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace nanogpt::train {

GradScaler::GradScaler(torch::Device device, bool enabled, Options options) : enabled_(enabled), options_(options) {
  auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(device);
  scale_ = torch::full({1}, enabled ? options.init_scale : 1.0, f32);
  growth_tracker_ = torch::zeros({1}, f32.dtype(torch::kInt));
  found_inf_ = torch::zeros({1}, f32);
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) const {
  if (!enabled_) return loss;
  return loss * scale_.to(loss.scalar_type());
}

void GradScaler::unscale(const std::vector<torch::Tensor>& grads) {
  if (!enabled_) return;
  found_inf_.zero_();
  auto inv_scale = scale_.to(torch::kDouble).reciprocal().to(torch::kFloat);
  // ATen's kernel wants every gradient on the scale's device. On the CPU it would also take a
  // gradient from elsewhere without a word, and CUDA would not: check here, where both fail alike.
  std::vector<torch::Tensor> scaled;
  for (size_t i = 0; i < grads.size(); ++i) {
    const auto& g = grads[i];
    if (!g.defined() || g.numel() == 0) continue;  // nothing to unscale (an empty parameter group)
    if (g.device() != scale_.device())
      throw std::runtime_error(fmt::format(
          "[train] loss scaling: gradient {} is on {}, the loss scale on {}: every gradient buffer must be made with "
          "the parameters' options",
          i, g.device().str(), scale_.device().str()));
    scaled.push_back(g);
  }
  if (!scaled.empty()) at::_amp_foreach_non_finite_check_and_unscale_(scaled, found_inf_, inv_scale);
}

bool GradScaler::step_ok() const { return !enabled_ || found_inf_.item<float>() == 0.0f; }

void GradScaler::update() {
  if (!enabled_) return;
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor, options_.backoff_factor,
                         options_.growth_interval);
}

double GradScaler::current_scale() const { return scale_.item<double>(); }

int64_t GradScaler::growth_tracker() const { return growth_tracker_.item<int64_t>(); }

void GradScaler::restore(double scale, int64_t growth_tracker) {
  if (!std::isfinite(scale) || scale <= 0.0)
    throw std::runtime_error(fmt::format("[ckpt] loss scale {:f} is not a positive finite number", scale));
  if (growth_tracker < 0) throw std::runtime_error("[ckpt] loss scale growth tracker is negative");
  scale_.fill_(scale);
  growth_tracker_.fill_(growth_tracker);
}

}  // namespace nanogpt::train
