// RMSNorm over the last dimension as one pass each way on the CPU. Written as tensor operations
// (x², mean, rsqrt, two products, the cast) RMSNorm is ~6 passes forward and ~10 in backward over
// the activations, each a separate kernel: the speedrun configs run 9 of them per step, and 4 more
// per-head ones for QK-norm. Here forward writes y and keeps 1/rms of each row; backward computes dx
// (and the weight's gradient) from x, that row scale and dy in one pass, summing the weight's
// gradient over fixed blocks of rows in a fixed order (the same bits for any thread count).
// Arithmetic in fp32, as the operations: y = (x · s) · w with s = 1 / sqrt(mean(x²) + eps).
// Covered: fp32 x with an fp32 weight or none, bf16 x without a weight (y rounded once); anything
// else (other dtypes, other devices) runs the operations.
#pragma once

#include <torch/torch.h>

#include <optional>

namespace nanogpt::model {

/// x (..., C) -> x / sqrt(mean(x², -1) + eps), times `weight` (C,) when given. In x's dtype (a weight
/// multiplies the fp32 result). Differentiable in x and the weight.
torch::Tensor fast_rms_norm(const torch::Tensor& x, const std::optional<torch::Tensor>& weight, double eps);

}  // namespace nanogpt::model
