// Linear and Embedding (see layers.h).
#include "model/layers.h"

namespace nanogpt::model {

LinearImpl::LinearImpl(int64_t in_features, int64_t out_features, bool bias, Fill fill)
    : in_(in_features), out_(out_features), has_bias_(bias), fill_(fill) {
  reset();
}

void LinearImpl::reset() {
  if (fill_ == Fill::random) {
    // LibTorch's own layer makes the tensors and draws their values: its initialisation exactly,
    // whatever it is in this LibTorch version.
    torch::nn::Linear made(torch::nn::LinearOptions(in_, out_).bias(has_bias_));
    weight = register_parameter("weight", made->weight);
    if (has_bias_) bias = register_parameter("bias", made->bias);
  } else {
    weight = register_parameter("weight", torch::empty({out_, in_}));
    if (has_bias_) bias = register_parameter("bias", torch::empty({out_}));
  }
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) { return torch::linear(x, weight, bias); }

EmbeddingImpl::EmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim, Fill fill)
    : num_(num_embeddings), dim_(embedding_dim), fill_(fill) {
  reset();
}

void EmbeddingImpl::reset() {
  weight = register_parameter("weight", fill_ == Fill::random
                                            ? torch::nn::Embedding(num_, dim_)->weight  // LibTorch's N(0, 1) draws
                                            : torch::empty({num_, dim_}));
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& idx) {
  return torch::embedding(weight, idx.contiguous(), /*padding_idx=*/-1, /*scale_grad_by_freq=*/false, /*sparse=*/false);
}

}  // namespace nanogpt::model
