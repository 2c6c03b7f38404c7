// Linear and Embedding layers: LibTorch's (the same parameters, names, forward and, by default,
// the same random initialisation, draw for draw), except that they can skip that initialisation.
// LibTorch's own modules fill their weights at random in the constructor with no way around it, and
// a model built only to have a checkpoint read into it (sampling) threw those draws away: the full
// preset's 10.6M weights took ~38 ms of a 0.3 s `sample` start-up (perf: LibTorch's uniform kernel
// and its CPU generator).
#pragma once

#include <torch/torch.h>

namespace nanogpt::model {

/// Whether a layer fills its parameters at construction: `random` as LibTorch's torch::nn::Linear
/// and torch::nn::Embedding do (consuming the same random numbers), `none` leaves them unset (for a
/// model whose every parameter is loaded next; the generator is not touched).
enum class Fill { random, none };

/// y = x Wᵀ + b: W (out, in), b (out) or none; torch::nn::Linear's parameters and forward.
class LinearImpl : public torch::nn::Cloneable<LinearImpl> {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, bool bias, Fill fill = Fill::random);
  void reset() override;
  /// x (..., in) -> (..., out).
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;  // (out, in)
  torch::Tensor bias;    // (out), undefined without a bias

 private:
  int64_t in_, out_;
  bool has_bias_;
  Fill fill_;
};
TORCH_MODULE(Linear);

/// Rows of `weight` (num, dim) by index; torch::nn::Embedding's parameter and forward (no padding
/// index, no max_norm).
class EmbeddingImpl : public torch::nn::Cloneable<EmbeddingImpl> {
 public:
  EmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim, Fill fill = Fill::random);
  void reset() override;
  /// idx (...) int64 -> (..., dim).
  torch::Tensor forward(const torch::Tensor& idx);

  torch::Tensor weight;  // (num, dim)

 private:
  int64_t num_, dim_;
  Fill fill_;
};
TORCH_MODULE(Embedding);

}  // namespace nanogpt::model
