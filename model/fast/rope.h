// RoPE's rotation on the CPU, forward and backward each one pass. Through LibTorch it is three
// kernels forward (x * cos, the halves swapped into a copy, addcmul) and four backward, each over
// the (B, T, nh + nkv, hs) queries and keys; and its output, laid out (B, T, H, hs), had to be
// copied again into (B, H, T, hs) for the score GEMMs. Here each element of q and k is read once and
// written once, in fp32 arithmetic rounded once to the input's dtype, straight into the (B, H, T, hs)
// layout that attention multiplies, queries and keys apart. Backward keeps nothing but the table
// rows: the gradient is the inverse rotation of the incoming one.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>

#include "model/fast/simd.h"

namespace nanogpt::model {

/// x (B, T, H, hs) fp32 or bf16 on the CPU, each row of hs values packed (the (B, T, H) strides are
/// free, so x may be a slice of a wider projection); cos2, sin2 fp32 contiguous (P, 1, hs) with rows
/// [cos, cos] and [-sin, sin] of each position (Rope's tables), P >= start + T. Rotates every head,
/// x1 cos - x2 sin, x2 cos + x1 sin, for positions start .. start + T - 1, and returns heads
/// [0, n_first) as (B, n_first, T, hs) and the rest as (B, H - n_first, T, hs), both contiguous:
/// the queries and the keys as attention multiplies them. Differentiable w.r.t. x.
std::pair<torch::Tensor, torch::Tensor> rope_rotate_split(const torch::Tensor& x, const torch::Tensor& cos2,
                                                          const torch::Tensor& sin2, int64_t start, int64_t n_first);

/// Whether rope_rotate_split takes x (else the caller's LibTorch path).
bool rope_rotate_applies(const torch::Tensor& x);

/// One head's row of 2 h values, fp32 or bf16 (raw bits), with cos2 = [cos, cos] and sin2 = [-sin, sin]
/// (Rope's table rows). Forward: y1 = x1 cos2_1 + x2 sin2_1, y2 = x2 cos2_2 + x1 sin2_2. Backward, the
/// transpose: dx1 = dy1 cos2_1 + dy2 sin2_2, dx2 = dy2 cos2_2 + dy1 sin2_1. out must not overlap in.
template <bool kBackward, class T>
inline void rope_rotate_row(const T* __restrict in, T* __restrict out, const float* __restrict cos2,
                            const float* __restrict sin2, int64_t h) {
#pragma omp simd
  for (int64_t i = 0; i < h; ++i) {
    const float a = load_float(in[i]), b = load_float(in[i + h]);
    store_float(a * cos2[i] + b * (kBackward ? sin2[i + h] : sin2[i]), out + i);
    store_float(b * cos2[i + h] + a * (kBackward ? sin2[i] : sin2[i + h]), out + i + h);
  }
}

}  // namespace nanogpt::model
