// The dot product and matrix-vector product of the hand-written CPU kernels (decode_attention.cpp,
// decoder.cpp): partial sums in kLanes independent lanes, which the compiler vectorises without
// reassociating (no -ffast-math), so they run at the vector width of whichever target_clones variant
// holds them.
#pragma once

#include <cstdint>

#include "model/fast/simd.h"

namespace nanogpt::model {

constexpr int64_t kLanes = 16;  // independent partial sums: one AVX-512 register

/// a · b over n elements, each fp32 or bf16 as its raw bits (simd.h's load_float), summed in fp32.
template <typename A, typename B>
inline float dot(const A* __restrict a, const B* __restrict b, int64_t n) {
  const int64_t full = n - n % kLanes;
  float lanes[kLanes] = {};
  for (int64_t i = 0; i < full; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] += load_float(a[i + j]) * load_float(b[i + j]);
  float s = 0.0f;
  for (int64_t j = 0; j < kLanes; ++j) s += lanes[j];
  for (int64_t i = full; i < n; ++i) s += load_float(a[i]) * load_float(b[i]);
  return s;
}

constexpr int64_t kRowBlock = 4;  // matvec_rows: output rows computed together

/// y[b * y_stride + r] (+)= w[r] · x[b * x_stride + ...] for rows r0 <= r < r1 and every b < B;
/// w (rows, cols) row-major. The matrix-vector product of the decoder (defined in decoder.cpp), and
/// attention's scores (keys · query), in fp32. The second form takes w in bf16 (raw bits) and rounds
/// x to bf16 first, as autocast rounds a bf16 product's inputs: each product is then exact, and the
/// sums are fp32 (autocast would round the result to bf16 too; this does not). Both run the widest
/// kernels the CPU has: AVX512-BF16 dot products (the second form), AVX-512, else portable code;
/// the environment variable NANOGPT_KERNELS=avx512f or =portable caps that.
void matvec_rows(const float* __restrict w, const float* __restrict x, int64_t x_stride, int64_t B, int64_t cols,
                 int64_t r0, int64_t r1, float* __restrict y, int64_t y_stride, bool accumulate);
void matvec_rows(const uint16_t* __restrict w, const float* __restrict x, int64_t x_stride, int64_t B, int64_t cols,
                 int64_t r0, int64_t r1, float* __restrict y, int64_t y_stride, bool accumulate);

/// A weight matrix (rows, cols) quantized to int8 row by row, as dynamic quantization does
/// (torch.ao.quantization.quantize_dynamic's per-channel weights): row r is scale[r] * (q[r] - 128),
/// the 8-bit integer stored offset by 128 (as unsigned bytes: the operand AVX512-VNNI's dot
/// product multiplies by signed ones).
struct Int8Rows {
  const uint8_t* q = nullptr;
  const float* scale = nullptr;
};

/// Quantizes w (rows, cols) fp32 into q and scale: scale[r] = max|w[r]| / 127 (1 for a row of
/// zeros), q = round(w / scale) + 128, so every weight is within scale / 2 of its value. A row
/// holding NaN or inf gets scale NaN (its products are NaN, as the fp32 model's would be).
void quantize_rows_int8(const float* w, int64_t rows, int64_t cols, uint8_t* q, float* scale);

/// y[b * y_stride + r] (+)= w[r] · x[b * x_stride + ...] for rows r0 <= r < r1 with int8 weights,
/// as a dynamically quantized linear layer: each row of x is quantized to int8 by its own
/// s = max|x| / 127 (x_q = nearbyint(x / s)), the integer products are summed exactly in int32, and
/// the sum is scaled by scale[r] * s in fp32. The AVX512-VNNI kernel and the portable one give the
/// same bits. A row of x holding NaN or inf gives NaN outputs.
void matvec_rows(const Int8Rows& w, const float* __restrict x, int64_t x_stride, int64_t B, int64_t cols,
                 int64_t r0, int64_t r1, float* __restrict y, int64_t y_stride, bool accumulate);

}  // namespace nanogpt::model
