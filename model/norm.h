// Normalisation layers for the pre-norm blocks: LayerNorm with an optional bias (PyTorch's
// LayerNorm has no bias=False before 2.1, and nanoGPT's char preset uses none), or RMSNorm.
#pragma once

#include <torch/torch.h>

#include <string>

namespace nanogpt::model {

class NormImpl : public torch::nn::Module {
 public:
  /// kind: "layernorm" (weight, optional bias) or "rmsnorm" (weight only); eps: ModelConfig::norm_eps.
  NormImpl(const std::string& kind, int64_t n_embd, bool bias, double eps = 1e-5);

  /// x (..., C) -> (..., C), same dtype as x's computation under autocast.
  torch::Tensor forward(const torch::Tensor& x);

  static constexpr double eps = 1e-5;  // the default epsilon (ModelConfig::norm_eps's)
  double epsilon() const { return eps_; }  // added to the variance (layernorm) or the mean square (rmsnorm)

  torch::Tensor weight;  // (C,) initialised to ones
  torch::Tensor bias;    // (C,) zeros, layernorm with bias only; undefined otherwise

 private:
  bool rms_;
  double eps_;
  int64_t n_embd_;
};
TORCH_MODULE(Norm);

}  // namespace nanogpt::model
