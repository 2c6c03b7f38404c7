// The feed-forward half of a block: C -> H, an activation, H -> C, dropout. The activation
// (ModelConfig::mlp): GELU (nanoGPT, H = 4C), or its tanh approximation (GPT-2's own); ReLU² = relu(x)², which modded-nanogpt and nanochat
// use (H = 4C); SwiGLU = silu(gate) * up, where c_fc computes [gate; up] (H = 8C/3: the same
// parameters with three matrices as two).
#pragma once

#include <torch/torch.h>

#include <string>

#include "model/config.h"
#include "model/fast/dropout.h"
#include "model/layers.h"

namespace nanogpt::model {

/// The activation of kind gelu | gelu_tanh | relu2 | swiglu on c_fc's output h (B, T, H), swiglu (B, T, 2H) -> (B, T, H).
torch::Tensor mlp_activation(const std::string& kind, const torch::Tensor& h);

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const ModelConfig& config, Fill fill = Fill::random);
  /// x (B, T, C) -> (B, T, C). In training, when c_fc's output h has at least kRecomputeMinValues
  /// values, the activation's output is not kept for backward but recomputed there from h.
  torch::Tensor forward(const torch::Tensor& x);
  /// forward without its dropout: c_proj's output (B, T, C), for a caller that fuses the dropout with
  /// the residual add after it (model/block.cpp on a GPU).
  torch::Tensor project(const torch::Tensor& x);
  /// The dropout forward applies now (0 outside training).
  double dropout_p() const { return dropout->active_p(); }

  /// Below this (4M values, 8 MB in bf16) the memory is not worth the extra pass: the Tang CPU
  /// config's 0.8M-value activations cost 0.7 ms of a 42 ms step to recompute; the full preset's
  /// 25M values save 300 MB for ~1%.
  static constexpr int64_t kRecomputeMinValues = int64_t{4} << 20;

  Linear c_fc{nullptr};    // C -> H (swiglu: C -> 2H, the gate and the up projection)
  Linear c_proj{nullptr};  // H -> C, an output projection (scaled init)

 private:
  std::string activation_;  // gelu | gelu_tanh | relu2 | swiglu
  Dropout dropout{nullptr};
};
TORCH_MODULE(MLP);

}  // namespace nanogpt::model
