// Causal attention for training on the CPU that keeps no (T, T) tensor between forward and backward.
// The math path (model/attention.cpp) keeps each layer's softmax weights (fp32) and dropped weights
// for backward: at the full preset (B 64, 6 heads, T 256) 150 MB per layer, plus its transients.
// Here the (batch, head) pairs go through in chunks small enough to stay in the cache; forward keeps
// only q, k and v, and backward recomputes each chunk's scores and softmax from them (its dropout
// mask from the seed, model/fast/dropout.h): FlashAttention's trade at the granularity of LibTorch's
// batched GEMMs, one more Q Kᵀ and softmax per chunk for no stored weights. The arithmetic per
// chunk is the math path's (baddbmm with the causal bias, fp32 softmax, dropout, bmm), so the two
// agree to rounding, dropout mask included (tests/test_model.cpp holds them together).
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace nanogpt::model {

/// softmax(q kᵀ / √hs + bias) v with dropout p on the weights. q, k, v (B, nh, T, hs), one dtype
/// (k and v already repeated for grouped-query heads); bias (T, T) additive 0 / -inf in q's dtype.
/// chunk_pairs (batch, head) pairs per chunk (>= 1). Returns (B, nh, T, hs). Differentiable in q, k, v.
torch::Tensor chunked_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const torch::Tensor& bias, double dropout_p, int64_t chunk_pairs);

/// Pairs per chunk for (T, Tk) scores: about 256K scores, whose fp32 weights, bf16 scores and
/// dropped weights (~2.5 MB) stay near the cores.
int64_t attention_chunk_pairs(int64_t T, int64_t Tk);

}  // namespace nanogpt::model
