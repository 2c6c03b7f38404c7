// MLP (see mlp.h).
#include "model/mlp.h"

#include "model/fast/linear.h"

namespace nanogpt::model {

MLPImpl::MLPImpl(const ModelConfig& config) {
  const int64_t C = config.n_embd;
  c_fc = register_module("c_fc", torch::nn::Linear(torch::nn::LinearOptions(C, 4 * C).bias(config.bias)));
  c_proj = register_module("c_proj", torch::nn::Linear(torch::nn::LinearOptions(4 * C, C).bias(config.bias)));
  dropout = register_module("dropout", Dropout(config.dropout));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  auto h = torch::gelu(dense(x, c_fc->weight, c_fc->bias));  // (B, T, 4C), exact (erf) GELU like nanoGPT
  return dropout(dense(h, c_proj->weight, c_proj->bias));    // (B, T, C)
}

}  // namespace nanogpt::model
