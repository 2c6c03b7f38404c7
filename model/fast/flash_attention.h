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

/// `attention: auto` trains on the CPU in bf16 with flash attention from this T on, with chunked
/// attention below it (model/fast/chunked_attention.h), and in fp32 with flash attention at every T.
/// Training steps on a 2-core AMD EPYC (Zen 5), bench medians of 2 alternating rounds: bf16 at T 64,
/// flash 64.1/65.3 ms against chunked 61.6/59.8 (the Shakespeare speedrun config) and 10.6/10.6
/// against 9.5/9.2 (the CPU preset); fp32 at T 64 capped to AVX2, 153.9/147.4 against 163.7/155.1 and
/// 25.1/25.1 against 26.1/25.7, with AVX-512 even (147.9/148.3 against 147.3/148.8). From T 128 flash
/// is faster in both (T 256 with dropout, the full preset: 425 against 537 ms a layer in fp32).
constexpr int64_t kFlashAttentionFromT = 128;

/// Whether `attention: auto` trains a CPU model whose attention runs in `dtype` at length T with
/// flash attention (else chunked).
inline bool flash_attention_trains(int64_t T, c10::ScalarType dtype) {
  return dtype == c10::kFloat || T >= kFlashAttentionFromT;
}

/// causal_softmax(q kᵀ / √hs) v with dropout p on the weights: query i sees keys 0..i. q (B, nh, T,
/// hs), k and v (B, nkv, T, hs) with nh a multiple of nkv (query head h reads kv head h / (nh / nkv)),
/// one dtype, fp32 or bf16, on the CPU; the last dimension contiguous or not, any layout. Returns (B,
/// nh, T, hs), laid out in memory as (B, T, nh, hs) (so that joining the heads copies nothing).
/// Differentiable in q, k, v. `block` (>= 1): queries and keys per block, the default for training.
torch::Tensor flash_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              double dropout_p, int64_t block = 64);

}  // namespace nanogpt::model
