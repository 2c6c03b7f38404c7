// The feed-forward half of a block: C -> 4C, GELU, 4C -> C, dropout.
#pragma once

#include <torch/torch.h>

#include "model/config.h"
#include "model/fast/dropout.h"

namespace nanogpt::model {

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const ModelConfig& config);
  /// x (B, T, C) -> (B, T, C).
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_fc{nullptr};    // C -> 4C
  torch::nn::Linear c_proj{nullptr};  // 4C -> C, an output projection (scaled init)

 private:
  Dropout dropout{nullptr};
};
TORCH_MODULE(MLP);

}  // namespace nanogpt::model
