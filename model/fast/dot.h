// The dot product and matrix-vector products of the hand-written CPU kernels (decode_attention.cpp,
// the decoder; defined in matvec.cpp, panels.cpp, int8_rows.cpp and int4_tiles.cpp): partial sums in
// kLanes independent lanes, which the compiler vectorises without reassociating (no -ffast-math), so
// they run at the vector width of whichever target_clones variant holds them.
#pragma once

#include <cstdint>

#include "model/fast/kernel_choice.h"
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
/// w (rows, cols) row-major. The matrix-vector product of the decoder (defined in matvec.cpp), and
/// attention's scores (keys · query), in fp32. The second form takes w in bf16 (raw bits) and rounds
/// x to bf16 first, as autocast rounds a bf16 product's inputs: each product is then exact, and the
/// sums are fp32 (autocast would round the result to bf16 too; this does not). Both run the widest
/// kernels the CPU has: AVX512-BF16 dot products (the second form), AVX-512, else portable code;
/// the environment variable NANOGPT_KERNELS=avx512f or =portable caps that.
void matvec_rows(const float* __restrict w, const float* __restrict x, int64_t x_stride, int64_t B, int64_t cols,
                 int64_t r0, int64_t r1, float* __restrict y, int64_t y_stride, bool accumulate);
void matvec_rows(const uint16_t* __restrict w, const float* __restrict x, int64_t x_stride, int64_t B, int64_t cols,
                 int64_t r0, int64_t r1, float* __restrict y, int64_t y_stride, bool accumulate);

/// An fp32 weight matrix (rows, cols) packed in panels of kPanel rows for products with several
/// rows of x at once (serve's batches): panel p holds rows kPanel * p .. + kPanel - 1 column after
/// column, kPanel values a column (the last panel padded with zero rows). Each output sits in one
/// vector lane and is summed over the columns in order, one multiply-add a column, so no sums
/// across lanes are needed and every output gets the same bits in a batch of any size.
constexpr int64_t kPanel = 16;
struct F32Panels {
  const float* data = nullptr;
  int64_t rows = 0, cols = 0;
};

/// y[b * y_stride + r] (+)= w[r] · x[b * x_stride + ...] for rows r0 <= r < r1 with F32Panels
/// weights: each output summed over the columns in order (an AVX-512 multiply-add per column where
/// the CPU has it). r0 a multiple of kPanel; r1 one too, or w.rows; r0 == r1 (anywhere) computes nothing.
void matvec_rows(const F32Panels& w, const float* __restrict x, int64_t x_stride, int64_t B, int64_t r0, int64_t r1,
                 float* __restrict y, int64_t y_stride, bool accumulate);

/// A bf16 weight matrix (rows, cols) in panels of kPanel rows for AVX512-BF16's dot product
/// (VDPBF16PS): panel p holds, for each pair of columns (2c, 2c + 1) in order, its kPanel rows' two
/// values side by side (64 bytes, one register; an odd cols' last pair and the last panel's
/// missing rows padded with zeros). Each output sits in one lane and adds each pair's two exact
/// products in order, so, as F32Panels, a row gets the same bits in a batch of any size.
struct Bf16Panels {
  const uint16_t* data = nullptr;
  int64_t rows = 0, cols = 0;
};
inline int64_t bf16_panel_pairs(int64_t cols) { return (cols + 1) / 2; }
/// Whether this machine multiplies Bf16Panels with AVX512-BF16 (avx512_bf16_kernels()): the
/// decoder packs its bf16 matrices so only then (else as rows, for matvec_rows above).
bool bf16_panels_supported();

/// The same product with Bf16Panels weights, x rounded to bf16 first (as matvec_rows with bf16
/// rows). r0 a multiple of kPanel; r1 one too, or w.rows.
void matvec_rows(const Bf16Panels& w, const float* __restrict x, int64_t x_stride, int64_t B, int64_t r0, int64_t r1,
                 float* __restrict y, int64_t y_stride, bool accumulate);

/// x (n values) -> q = nearbyint(x / s), s = max|x| / 127 (1 for zeros), clamped to ±127; returns s,
/// and Σ q in *sum. NaN or inf in x: s is NaN and q zeros. (Each product's input, and with
/// `--quantize` the KV cache's keys, values and queries.)
float quantize_row_int8(const float* __restrict x, int64_t n, int8_t* __restrict q, int32_t* sum);

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

/// A weight matrix (rows, cols) quantized to 4 bits, for sampling (`--quantize=int4`): each group of
/// kInt4Group columns of a row is d * u + m with u in 0..15, d = (max - min) / 15 and m = min of the
/// group (asymmetric, as llama.cpp's Q4_1; d and m in bf16): 0.5625 bytes a weight, the nibbles and
/// the scales (the full-preset model's 10.6M weights in 6.0 MB against int8's 10.7). Laid out for
/// products kInt4Tile rows at a time, one AVX-512 register of int32 sums a row each: tile t holds
/// rows kInt4Tile * t .. + kInt4Tile - 1 (the last padded with zero rows), group after group, each
/// group as kInt4Group / 8 chunks of 64 bytes and then 64 bytes of scales.
/// Chunk c of group g covers columns k = g * kInt4Group + 8c .. k + 7: its byte 4j + i holds
/// u[row j][k + i] in the low nibble and u[row j][k + 4 + i] in the high one (so each 32-bit lane
/// is one row, four columns a nibble plane). The scales: the 16 rows' d, then their m, as bf16
/// bits. Columns past `cols` (padded to whole groups) are u = 0 and meet zero inputs.
constexpr int64_t kInt4Tile = 16;
constexpr int64_t kInt4Group = 64;
struct Int4Tiles {
  const uint8_t* data = nullptr;
  int64_t rows = 0, cols = 0;  // the matrix's, unpadded
};

/// Bytes of a (rows, cols) matrix's Int4Tiles.
int64_t int4_bytes(int64_t rows, int64_t cols);

/// Quantizes w (rows, cols) fp32 into `out` (int4_bytes(rows, cols) bytes). Every weight ends
/// within half a step (d / 2) of its value, plus bf16's rounding of d and m. A group holding NaN
/// or inf gets d NaN (its row's products are NaN, as the fp32 model's would be).
void quantize_int4(const float* w, int64_t rows, int64_t cols, uint8_t* out);

/// Weight (r, c) as the products use it: d * u + m.
float int4_weight(const Int4Tiles& w, int64_t r, int64_t c);

/// y[b * y_stride + r] (+)= w[r] · x[b * x_stride + ...] for rows r0 <= r < r1 with Int4Tiles
/// weights: each row of x quantized to int8 by its own s = max|x| / 127 as the int8 product's, then
/// per group the exact integer sum Σ u x_q (int32) and Σ x_q, and y = s Σ_g (d Σ u x_q + m Σ x_q) in
/// fp32 fused multiply-adds, group by group. r0 a multiple of kInt4Tile; r1 one too, or w.rows.
/// AVX512-VNNI kernel and portable loops give the same bits. A row of x holding NaN or inf gives
/// NaN outputs.
void matvec_rows(const Int4Tiles& w, const float* __restrict x, int64_t x_stride, int64_t B, int64_t r0, int64_t r1,
                 float* __restrict y, int64_t y_stride, bool accumulate);

}  // namespace nanogpt::model
