// relu(h)², the MLP activation of the modern recipe (mlp: relu2), in one pass each way on the CPU.
// As tensor operations it is relu and square forward, and backward (the MLP recomputes the activation
// from h: model/mlp.cpp) relu, square, square's gradient (two products) and relu's mask again, each a
// pass over the MLP's widest tensor. Here: a = r², r = max(h, 0), and dh = (2 r) da where h > 0, else
// 0 — the operations' arithmetic and rounding (a NaN h gives NaN, as relu keeps it). fp32 and bf16 on
// the CPU; elsewhere the operations.
#pragma once

#include <torch/torch.h>

#include <utility>

namespace nanogpt::model {

/// relu(h)² in h's dtype. Differentiable (through the operations when h requires grad).
torch::Tensor fast_relu_squared(const torch::Tensor& h);

/// {relu(h)², dh} for the gradient g at the output, in one pass, in h's dtype (g converted to it):
/// for a backward that recomputes the activation from h. Not differentiable.
std::pair<torch::Tensor, torch::Tensor> fast_relu_squared_backward(const torch::Tensor& h, const torch::Tensor& g);

}  // namespace nanogpt::model
