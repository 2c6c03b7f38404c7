// GELU (the exact, erf form nanoGPT's MLP uses) with its slope from the same pass, on AVX-512 or AVX2
// + FMA CPUs.
// LibTorch's backward (gelu_backward) evaluates erf and exp again from the kept input, and costs twice
// its forward: at the CPU preset, 0.16 ms a layer against the forward's 0.08 (bf16, 2 threads). Here
// the forward writes GELU(h) and GELU'(h) = Phi(h) + h phi(h) together (phi's exp(-h²/2) is the one
// erf already needs), keeps the slope instead of h, and backward is one multiply. A backward that
// recomputes the activation (MLP's ProjectActivation) gets GELU(h) and dh = g GELU'(h) in one pass.
// erf is Abramowitz & Stegun 7.1.26, the approximation LibTorch's own vectorised erf uses (error
// <= 1.5e-7); elsewhere (neither instruction set, CUDA, other dtypes) both fall back to LibTorch's
// ops.
#pragma once

#include <torch/torch.h>

#include <utility>

namespace nanogpt::model {

/// GELU(h) = h Phi(h), as torch::gelu's default. Differentiable; keeps the slope (in h's dtype) for
/// backward when h requires grad.
torch::Tensor fast_gelu(const torch::Tensor& h);

/// {GELU(h), g * GELU'(h)} in one pass, in h's dtype (g is converted to it): for a backward that
/// recomputes the activation from h. Not differentiable.
std::pair<torch::Tensor, torch::Tensor> fast_gelu_backward(const torch::Tensor& h, const torch::Tensor& g);

}  // namespace nanogpt::model
