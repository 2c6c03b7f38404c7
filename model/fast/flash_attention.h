// Causal attention for training on the CPU, FlashAttention's way (Dao et al., 2022): each block of
// queries meets the blocks of keys it can see, one at a time, under an online softmax (a running
// row maximum and sum rescale what was accumulated so far), so no (T, T) scores ever exist for a
// head; blocks wholly above the diagonal are skipped. Forward keeps q, k, v, the output and one
// log-sum-exp per query row; backward recomputes each block's scores from them. The dropout mask is
// model/fast/dropout.h's mask of (seed, element), element n T² + i T + j for pair n, query i, key j,
// so it equals the mask that chunked attention and the math path apply for the same seed. Grouped-
// query heads read their shared key/value head in place (no repeated copies). The block products
// are small fp32 GEMMs (BLAS), the softmax between them a loop built per instruction set
// (model/fast/simd.h); bf16 tensors are widened to fp32 per block and the results rounded once.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace nanogpt::model {

/// `attention: auto` trains on the CPU with flash attention from this T on, with chunked attention
/// below it (model/fast/chunked_attention.h). Measured on a 2-core AVX2 EPYC, one layer's forward and
/// backward in fp32, one thread: T 64 (CPU preset) 2.6 ms flash vs 2.1 chunked, which keeps its weights
/// instead of recomputing them; T 128 9.0 vs 10.8 ms; T 256 with dropout (full preset) 425 vs 537 ms.
constexpr int64_t kFlashAttentionFromT = 128;

/// causal_softmax(q kᵀ / √hs) v with dropout p on the weights: query i sees keys 0..i. q (B, nh, T,
/// hs), k and v (B, nkv, T, hs) with nh a multiple of nkv (query head h reads kv head h / (nh / nkv)),
/// one dtype, fp32 or bf16, on the CPU; the last dimension contiguous or not, any layout. Returns (B,
/// nh, T, hs), laid out in memory as (B, T, nh, hs) (so that joining the heads copies nothing).
/// Differentiable in q, k, v. `block` (>= 1): queries and keys per block, the default for training.
torch::Tensor flash_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              double dropout_p, int64_t block = 64);

}  // namespace nanogpt::model
