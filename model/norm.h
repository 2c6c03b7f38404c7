// Normalisation layers for the pre-norm blocks: LayerNorm with an optional bias (PyTorch's
// LayerNorm has no bias=False before 2.1, and nanoGPT's char preset uses none), or RMSNorm.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>

namespace nanogpt::model {

class NormImpl : public torch::nn::Module {
 public:
  /// kind: "layernorm" (weight, optional bias) or "rmsnorm" (weight only); eps: ModelConfig::norm_eps.
  NormImpl(const std::string& kind, int64_t n_embd, bool bias, double eps = 1e-5);

  /// x (..., C) -> (..., C), same dtype as x's computation under autocast.
  torch::Tensor forward(const torch::Tensor& x);

  static constexpr double eps = 1e-5;  // the default epsilon (ModelConfig::norm_eps's)
  double epsilon() const { return eps_; }  // added to the variance (layernorm) or the mean square (rmsnorm)
  bool is_rms() const { return rms_; }     // rmsnorm (else layernorm)

  torch::Tensor weight;  // (C,) initialised to ones
  torch::Tensor bias;    // (C,) zeros, layernorm with bias only; undefined otherwise

 private:
  bool rms_;
  double eps_;
  int64_t n_embd_;
};
TORCH_MODULE(Norm);

/// A block's residual add and the norm after it: h = x + dropout_p(y), and n = norm(h) when `norm` is
/// given; returns {h, n} (n undefined without a norm). x (..., C), y its shape; p: 0 outside training.
/// On a GPU one kernel each way where the CUDA plugin's takes the tensors (fp32 x, C a multiple of 4
/// up to 1,024: model/cuda/residual_norm_kernel.h), its dropout mask drawn from the GPU's generator
/// and not fast_dropout's; elsewhere the unfused ops, as the lesson's block writes them.
std::pair<torch::Tensor, torch::Tensor> residual_add_norm(const torch::Tensor& x, const torch::Tensor& y, double p,
                                                          NormImpl* norm);

}  // namespace nanogpt::model
