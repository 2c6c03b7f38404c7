// Dropout whose mask is cheap to draw on the CPU and never stored. LibTorch's CPU dropout draws its
// mask with a Bernoulli kernel that takes ~0.4 s per 25M values here (2.11, 2 threads; 1.13 was no
// better), more than the whole rest of a training step at the full Shakespeare preset, and autograd
// keeps that fp32 mask until backward. Here the mask is a function of (seed, element index): keep
// element i when its 16-bit slice of SplitMix64(seed + i / 4) is >= p * 65536, scale kept elements by
// 1 / (1 - p). Forward applies it in one parallel pass; backward applies the same mask to the
// gradient, recomputed from the seed, so a training step holds no mask at all (at the full preset,
// 13 masks of 25 MB).
// The seed is one 64-bit draw from LibTorch's default CPU generator per call, so torch::manual_seed
// makes runs reproducible and a checkpointed generator state makes resume exact; the mask does not
// depend on the thread count. On CUDA it defers to LibTorch's fused dropout kernel.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace nanogpt::model {

/// Inverted dropout: in training, zeroes each element with probability p and scales the rest by
/// 1 / (1 - p); otherwise (or when p == 0) returns x unchanged. Differentiable.
torch::Tensor fast_dropout(const torch::Tensor& x, double p, bool training);

/// A fresh dropout seed: one draw from LibTorch's default CPU generator.
uint64_t draw_dropout_seed();

/// The mask of stream `seed`, elements offset .. offset + numel - 1, applied to x (any float dtype,
/// any device): x[i] / (1 - p) where element offset + i is kept, else 0, computed in fp32 (fp64 for double)
/// and rounded once to `out_dtype`. Not differentiable: the building block of fast_dropout and of
/// attention that re-applies a mask in backward (model/fast/chunked_attention.h).
torch::Tensor apply_dropout_mask(const torch::Tensor& x, double p, uint64_t seed, int64_t offset,
                                 torch::ScalarType out_dtype);

/// apply_dropout_mask in tensor operations, for a tensor on any device (apply_dropout_mask calls it
/// for one not on the CPU: `attention: chunked` on a GPU). The same mask and the same values as the
/// CPU loop, at the cost of a few int64 temporaries per element.
torch::Tensor apply_dropout_mask_by_ops(const torch::Tensor& x, double p, uint64_t seed, int64_t offset,
                                        torch::ScalarType out_dtype);

/// Module form, a drop-in for torch::nn::Dropout.
class DropoutImpl : public torch::nn::Module {
 public:
  explicit DropoutImpl(double p = 0.5) : p_(p) {}
  torch::Tensor forward(const torch::Tensor& x) { return fast_dropout(x, p_, is_training()); }
  /// The probability forward drops an element with now: p, or 0 outside training.
  double active_p() const { return is_training() ? p_ : 0.0; }

 private:
  double p_;
};
TORCH_MODULE(Dropout);

}  // namespace nanogpt::model
