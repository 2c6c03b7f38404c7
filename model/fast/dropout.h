// Dropout whose mask is cheap to draw on the CPU. LibTorch's CPU dropout draws its mask with a
// Bernoulli kernel that takes ~0.4 s per 25M values here (2.11, 2 threads; 1.13 was no better),
// more than the whole rest of a training step at the full Shakespeare preset. Here the mask comes from a
// counter-based hash (SplitMix64 of seed + index), filled in parallel: keep element i when its
// 16-bit slice of hash(seed, i / 4) is >= p * 65536, scale kept elements by 1 / (1 - p).
// The seed is one 64-bit draw from LibTorch's default CPU generator per call, so torch::manual_seed
// makes runs reproducible and a checkpointed generator state makes resume exact; the mask does not
// depend on the thread count. On CUDA it defers to LibTorch's fused dropout kernel.
#pragma once

#include <torch/torch.h>

namespace nanogpt::model {

/// Inverted dropout: in training, zeroes each element with probability p and scales the rest by
/// 1 / (1 - p); otherwise (or when p == 0) returns x unchanged. Differentiable.
torch::Tensor fast_dropout(const torch::Tensor& x, double p, bool training);

/// Module form, a drop-in for torch::nn::Dropout.
class DropoutImpl : public torch::nn::Module {
 public:
  explicit DropoutImpl(double p = 0.5) : p_(p) {}
  torch::Tensor forward(const torch::Tensor& x) { return fast_dropout(x, p_, is_training()); }

 private:
  double p_;
};
TORCH_MODULE(Dropout);

}  // namespace nanogpt::model
