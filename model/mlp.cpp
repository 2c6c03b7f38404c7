// MLP (see mlp.h).
#include "model/mlp.h"

#include "model/fast/linear.h"

namespace nanogpt::model {

MLPImpl::MLPImpl(const ModelConfig& config) : activation_(config.mlp) {
  const int64_t C = config.n_embd, H = config.mlp_hidden(), fc_out = activation_ == "swiglu" ? 2 * H : H;
  c_fc = register_module("c_fc", torch::nn::Linear(torch::nn::LinearOptions(C, fc_out).bias(config.bias)));
  c_proj = register_module("c_proj", torch::nn::Linear(torch::nn::LinearOptions(H, C).bias(config.bias)));
  dropout = register_module("dropout", Dropout(config.dropout));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  auto h = dense(x, c_fc->weight, c_fc->bias);  // (B, T, H), swiglu (B, T, 2H)
  if (activation_ == "gelu") {
    h = torch::gelu(h);  // exact (erf) GELU like nanoGPT
  } else if (activation_ == "relu2") {
    h = torch::relu(h).square();
  } else {  // swiglu
    auto gate_up = h.chunk(2, -1);
    h = torch::silu(gate_up[0]) * gate_up[1];  // (B, T, H)
  }
  return dropout(dense(h, c_proj->weight, c_proj->bias));  // (B, T, C)
}

}  // namespace nanogpt::model
