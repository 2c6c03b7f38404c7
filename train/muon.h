// Muon's core: the orthogonalisation of an update matrix. For a gradient-like matrix G = U S Vᵀ,
// Muon steps along U Vᵀ — every singular direction with the same size — instead of G itself
// (Jordan et al. 2024, "Muon: an optimizer for hidden layers"). U Vᵀ is approximated without an
// SVD by a few Newton–Schulz iterations of the odd quintic p(x) = a x + b x³ + c x⁵ applied to the
// singular values: X ← a X + (b A + c A²) X with A = X Xᵀ, starting from G / ‖G‖_F (so every
// singular value is in (0, 1]). The coefficients (3.4445, -4.7750, 2.0315) trade exactness for
// speed: they pull even tiny singular values up fast, and leave all of them in a band around 1
// (about 0.7 to 1.2) rather than at exactly 1, which is all the optimizer needs.
// The update rule itself (momentum, Nesterov, scaling) is in FlatAdamW (train/adamw.h).
#pragma once

#include <torch/torch.h>

#include <vector>

namespace nanogpt::train {

/// G (rows, cols) -> an approximation of U Vᵀ, same shape and dtype as G; or a batch G (k, rows,
/// cols), each matrix on its own (its own norm), in batched products. `dtype` is the arithmetic of
/// the iterations (bf16 on hardware with fast bf16 matmuls, else fp32).
torch::Tensor orthogonalize(const torch::Tensor& G, torch::ScalarType dtype = torch::kBFloat16, int steps = 5);

/// Each matrix orthogonalised as orthogonalize would, the same-shaped ones (a tall matrix counted as
/// its transpose) stacked into one batch: a model's 4 n_layer attention matrices and 2 n_layer MLP
/// matrices are two batches rather than 6 n_layer separate small products a step.
std::vector<torch::Tensor> orthogonalize_all(const std::vector<torch::Tensor>& matrices,
                                             torch::ScalarType dtype = torch::kBFloat16, int steps = 5);

}  // namespace nanogpt::train
