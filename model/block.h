// A pre-norm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x)). On a GPU the residual adds
// run fused with the dropout and norm after them (model/norm.h's residual_add_norm).
#pragma once

#include <torch/torch.h>

#include "model/attention.h"
#include "model/config.h"
#include "model/mlp.h"
#include "model/norm.h"

namespace nanogpt::model {

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const ModelConfig& config, Fill fill = Fill::random);
  /// x (B, T, C) -> (B, T, C).
  torch::Tensor forward(const torch::Tensor& x, const AttentionContext& ctx = {});

  Norm ln_1{nullptr};
  CausalSelfAttention attn{nullptr};
  Norm ln_2{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(Block);

}  // namespace nanogpt::model
