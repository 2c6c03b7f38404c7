// LayerNorm / RMSNorm (see norm.h).
#include "model/norm.h"

#include "model/fast/dropout.h"
#include "model/fast/rms_norm.h"
#include "runtime/cuda_plugin.h"

namespace nanogpt::model {

NormImpl::NormImpl(const std::string& kind, int64_t n_embd, bool bias, double eps)
    : rms_(kind == "rmsnorm"), eps_(eps), n_embd_(n_embd) {
  weight = register_parameter("weight", torch::ones({n_embd}));
  if (bias && !rms_) this->bias = register_parameter("bias", torch::zeros({n_embd}));
}

torch::Tensor NormImpl::forward(const torch::Tensor& x) {
  if (!rms_) return torch::layer_norm(x, {n_embd_}, weight, bias, eps_);
  // RMSNorm: x / sqrt(mean(x²) + eps) * weight, computed in fp32 for stability (one pass each way
  // on the CPU).
  return fast_rms_norm(x, weight, eps_);
}

std::pair<torch::Tensor, torch::Tensor> residual_add_norm(const torch::Tensor& x, const torch::Tensor& y, double p,
                                                          NormImpl* norm) {
  const runtime::CudaPlugin* plugin = x.is_cuda() ? runtime::cuda_plugin() : nullptr;
  if (plugin && plugin->residual_dropout_norm) {
    auto fused = norm ? plugin->residual_dropout_norm(x, y, p, {}, norm->weight, norm->bias, norm->epsilon(), norm->is_rms())
                      : plugin->residual_dropout_norm(x, y, p, {}, {}, {}, 0.0, false);
    if (fused.first.defined()) return fused;  // else a dtype or width it has no kernel for
  }
  auto h = x + fast_dropout(y, p, p > 0);                                  // (..., C)
  return {h, norm ? norm->forward(h) : torch::Tensor()};
}

}  // namespace nanogpt::model
