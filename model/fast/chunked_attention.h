// Causal attention for training on the CPU, one autograd node: the math path's arithmetic
// (model/attention.cpp) without its dozen nodes, casts and stored fp32 weights. Each chunk of
// (batch, head) pairs is q kᵀ (a batched GEMM in q's dtype), a fused causal softmax
// (model/fast/causal_softmax.h: scaled, masked and normalised in one pass, weights in q's dtype),
// dropout, and the product with v. The math path keeps each layer's softmax weights (fp32) and
// dropped weights for backward: at the full preset (B 64, 6 heads, T 256) 150 MB per layer, plus its
// transients. So where the pairs need several chunks of cache-sized scores, forward keeps only q, k
// and v, and backward recomputes each chunk's scores and softmax from them (its dropout mask from the
// seed, model/fast/dropout.h): FlashAttention's trade at the granularity of LibTorch's batched
// GEMMs, one more Q Kᵀ and softmax per chunk for no stored weights. When one chunk holds every pair
// (the CPU preset's T = 64), its weights are small and kept instead. Both agree with the math path to
// rounding, dropout mask included (tests/test_model_recompute.cpp holds them together).
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace nanogpt::model {

/// causal_softmax(q kᵀ / √hs) v with dropout p on the weights: query i sees keys 0..i. q, k, v
/// (B, nh, T, hs), one dtype (k and v already repeated for grouped-query heads). chunk_pairs (batch,
/// head) pairs per chunk (>= 1). Returns (B, nh, T, hs). Differentiable in q, k, v.
torch::Tensor chunked_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                double dropout_p, int64_t chunk_pairs);

/// Pairs per chunk for (T, Tk) scores: about 256K scores, whose fp32 weights, bf16 scores and
/// dropped weights (~2.5 MB) stay near the cores.
int64_t attention_chunk_pairs(int64_t T, int64_t Tk);

}  // namespace nanogpt::model
