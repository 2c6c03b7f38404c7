// The feed-forward half of a block: C -> H, an activation, H -> C, dropout. The activation
// (ModelConfig::mlp): GELU (nanoGPT, H = 4C); ReLU² = relu(x)², which modded-nanogpt and nanochat
// use (H = 4C); SwiGLU = silu(gate) * up, where c_fc computes [gate; up] (H = 8C/3: the same
// parameters with three matrices as two).
#pragma once

#include <torch/torch.h>

#include <string>

#include "model/config.h"
#include "model/fast/dropout.h"

namespace nanogpt::model {

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const ModelConfig& config);
  /// x (B, T, C) -> (B, T, C).
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_fc{nullptr};    // C -> H (swiglu: C -> 2H, the gate and the up projection)
  torch::nn::Linear c_proj{nullptr};  // H -> C, an output projection (scaled init)

 private:
  std::string activation_;  // gelu | relu2 | swiglu
  Dropout dropout{nullptr};
};
TORCH_MODULE(MLP);

}  // namespace nanogpt::model
