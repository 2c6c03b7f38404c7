// Weights quantized to int8 row by row, as dynamic quantization stores a Linear layer's (dot.h's
// Int8Rows, `nanogpt sample --quantize=int8`), and their products: each row of x quantized to int8
// by its own scale (quantize_row_int8, which the int4 product and the int8 KV cache also use), the
// integer products summed exactly in int32 (AVX512-VNNI's VPDPBUSD, four pairs an instruction,
// AVX2's VPMADDWD, two, or plain C++ lane sums: the same bits), then scaled in fp32. The weights are
// quantized by the same rule as the inputs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "model/fast/avx2.h"
#include "model/fast/dot.h"
#include "model/fast/kernel_choice.h"
#include "model/fast/products.h"
#include "model/fast/simd.h"

namespace nanogpt::model {

namespace {

// Rows r0 <= r < r1 of the int8 product for each of B rows of xq (int8, `cols` apart), four rows at a
// time as matvec.cpp's matvec_rows_blocks: sums(w4, xb, full, s) sets s[k] to the integer dot
// product of the stored bytes w4[k] (q + 128) and xb over the first `full` columns; the rest are
// added here. Then Σ (q + 128) x_q - 128 Σ x_q = Σ q x_q, scaled. The sums are exact in int32
// while 255 * 127 * cols < 2^31 (cols < 66,000); integer sums do not depend on their order, so
// every kernel gives the same bits.
template <typename Sums>
NANOGPT_INLINE void matvec_rows_int8_blocks(const Int8Rows& w, const int8_t* __restrict xq,
                                                                    const float* xs, const int32_t* xsum, int64_t B,
                                                                    int64_t cols, int64_t r0, int64_t r1,
                                                                    float* __restrict y, int64_t y_stride,
                                                                    bool accumulate, Sums sums) {
  const int64_t full = cols - cols % Sums::kStep;
  const auto store = [&](int64_t b, int64_t r, int32_t dot) {
    const float v = w.scale[r] * xs[b] * static_cast<float>(dot - 128 * xsum[b]);
    float& out = y[b * y_stride + r];
    out = accumulate ? out + v : v;
  };
  int64_t r = r0;
  for (; r + kRowBlock <= r1; r += kRowBlock) {
    const uint8_t* w0 = w.q + r * cols;
    const uint8_t* const rows[kRowBlock] = {w0, w0 + cols, w0 + 2 * cols, w0 + 3 * cols};
    for (int64_t b = 0; b < B; ++b) {
      const int8_t* xb = xq + b * cols;
      int32_t s[kRowBlock];
      sums(rows, xb, full, s);
      for (int64_t k = 0; k < kRowBlock; ++k) {
        for (int64_t i = full; i < cols; ++i) s[k] += int32_t{rows[k][i]} * int32_t{xb[i]};
        store(b, r + k, s[k]);
      }
    }
  }
  for (; r < r1; ++r)  // the last rows, fewer than a block
    for (int64_t b = 0; b < B; ++b) {
      int32_t s = 0;
      for (int64_t i = 0; i < cols; ++i) s += int32_t{w.q[r * cols + i]} * int32_t{xq[b * cols + i]};
      store(b, r, s);
    }
}

NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, void, matvec_rows_int8_portable, (const Int8Rows& w, const int8_t* __restrict xq,
               const float* xs, const int32_t* xsum, int64_t B, int64_t cols, int64_t r0, int64_t r1,
               float* __restrict y, int64_t y_stride, bool accumulate), (w, xq, xs, xsum, B, cols, r0, r1, y, y_stride,
               accumulate), {
  matvec_rows_int8_blocks(w, xq, xs, xsum, B, cols, r0, r1, y, y_stride, accumulate, LaneSums{});
})

#if NANOGPT_X86_INTRINSICS
// VPDPBUSD: 64 byte pairs of a row a step, each lane adding four products of an unsigned weight
// byte and a signed x byte into int32 (no saturation). Then the four rows' lanes summed by
// sum_lanes' tree, in integers. Full-preset model's 24 matrices, 2 threads, a barrier after each
// (/tmp microbenchmark, 4 runs): 240-247 us a token against 562-656 for the bf16 dot products on
// the same rows: half the bytes, and four products an instruction where converting int8 to fp32
// for FMAs (559-701 us) ran out of arithmetic.
struct Avx512VnniSums {
  static constexpr int64_t kStep = 64;
  __attribute__((target("avx512f,avx512bw,avx512vnni"))) void operator()(const uint8_t* const (&w)[kRowBlock],
                                                                         const int8_t* __restrict xb, int64_t full,
                                                                         int32_t (&s)[kRowBlock]) const {
    __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512(), a2 = _mm512_setzero_si512(),
            a3 = _mm512_setzero_si512();
    for (int64_t i = 0; i < full; i += kStep) {
      const __m512i xv = _mm512_loadu_si512(xb + i);
      a0 = _mm512_dpbusd_epi32(a0, _mm512_loadu_si512(w[0] + i), xv);
      a1 = _mm512_dpbusd_epi32(a1, _mm512_loadu_si512(w[1] + i), xv);
      a2 = _mm512_dpbusd_epi32(a2, _mm512_loadu_si512(w[2] + i), xv);
      a3 = _mm512_dpbusd_epi32(a3, _mm512_loadu_si512(w[3] + i), xv);
    }
    sum_lanes(_mm512_castsi512_ps(a0), _mm512_castsi512_ps(a1), _mm512_castsi512_ps(a2), _mm512_castsi512_ps(a3), s,
              AddInt32{});
  }
};

__attribute__((target("avx512f,avx512bw,avx512vnni"), flatten))
void matvec_rows_int8_vnni(const Int8Rows& w, const int8_t* __restrict xq, const float* xs, const int32_t* xsum,
                           int64_t B, int64_t cols, int64_t r0, int64_t r1, float* __restrict y, int64_t y_stride,
                           bool accumulate) {
  matvec_rows_int8_blocks(w, xq, xs, xsum, B, cols, r0, r1, y, y_stride, accumulate, Avx512VnniSums{});
}

// Without VNNI (a laptop's AVX2): 16 bytes of each of four rows and of x widened to int16
// (VPMOVZXBW, VPMOVSXBW), then VPMADDWD adds each lane's two products into int32: exact (|product|
// < 2^15, no saturation, as VPMADDUBSW's pairs of 255 * 127 would have), the same sums.
struct Avx2Int8Sums {
  static constexpr int64_t kStep = 16;
  __attribute__((target("avx2,fma"))) void operator()(const uint8_t* const (&w)[kRowBlock],
                                                      const int8_t* __restrict xb, int64_t full,
                                                      int32_t (&s)[kRowBlock]) const {
    __m256i a[kRowBlock];
    for (int64_t k = 0; k < kRowBlock; ++k) a[k] = _mm256_setzero_si256();
    for (int64_t i = 0; i < full; i += kStep) {
      const __m256i xv = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb + i)));
      for (int64_t k = 0; k < kRowBlock; ++k) {
        const __m256i wv = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[k] + i)));
        a[k] = _mm256_add_epi32(a[k], _mm256_madd_epi16(wv, xv));
      }
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(s), sum_lanes4(a[0], a[1], a[2], a[3]));
  }
};

__attribute__((target("avx2,fma"), flatten))
void matvec_rows_int8_avx2(const Int8Rows& w, const int8_t* __restrict xq, const float* xs, const int32_t* xsum,
                           int64_t B, int64_t cols, int64_t r0, int64_t r1, float* __restrict y, int64_t y_stride,
                           bool accumulate) {
  matvec_rows_int8_blocks(w, xq, xs, xsum, B, cols, r0, r1, y, y_stride, accumulate, Avx2Int8Sums{});
}
#endif

// x (cols) -> xq = nearbyint(x / s), s = max|x| / 127 (1 for zeros); returns s, and Σ xq in *sum.
// NaN or inf in x: s is NaN (so are the products' outputs) and xq zeros. Each thread quantizes each
// product's input itself, so these loops run 24 times a token per thread on the full-preset model:
// as scalar code (nearbyintf through the PLT, no vector max) they took 13% of a token's time.
NANOGPT_KERNEL(NANOGPT_SIMD_CLONES, float, quantize_row_int8_portable, (const float* __restrict x, int64_t cols,
               int8_t* __restrict xq, int32_t* sum), (x, cols, xq, sum), {
  float amax = 0.0f, nonfinite = 0.0f;  // nonfinite: x - x summed, NaN once any x is NaN or inf
_Pragma("omp simd reduction(max : amax) reduction(+ : nonfinite)")
  for (int64_t i = 0; i < cols; ++i) {
    amax = std::max(amax, std::fabs(x[i]));
    nonfinite += x[i] - x[i];
  }
  int32_t total = 0;
  if (nonfinite != 0.0f) {  // NaN compares unequal
    std::fill(xq, xq + cols, int8_t{0});
    *sum = 0;
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
_Pragma("omp simd reduction(+ : total)")
  for (int64_t i = 0; i < cols; ++i) {
    const float v = std::nearbyint(x[i] / s);
    xq[i] = static_cast<int8_t>(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
    total += xq[i];
  }
  *sum = total;
  return s;
})

#if NANOGPT_X86_INTRINSICS
// The intrinsics' scale from their lanes' largest |x| and sums of x - x (NaN once any x is NaN or
// inf): max |x| / 127 (1 for zeros); or NaN, with xq zeroed and *sum 0.
inline float int8_scale(const float* lanes, const float* holes, int n, int8_t* xq, int64_t cols, int32_t* sum) {
  float m = 0.0f, bad = 0.0f;
  for (int k = 0; k < n; ++k) {
    m = std::max(m, lanes[k]);
    bad += holes[k];
  }
  if (bad != 0.0f) {  // NaN compares unequal
    std::fill(xq, xq + cols, int8_t{0});
    *sum = 0;
    return std::numeric_limits<float>::quiet_NaN();
  }
  return m > 0.0f ? m / 127.0f : 1.0f;
}

// The same with AVX-512 intrinsics, the same bits (IEEE division, round to nearest even, the same
// clamp): GCC vectorised the portable loop's int8 stores at 128 bits, with blends, at ~4x the
// instructions.
__attribute__((target("avx512f")))
float quantize_row_int8_avx512(const float* __restrict x, int64_t cols, int8_t* __restrict xq, int32_t* sum) {
  // (The all-ones masked forms, and the lanes reduced through memory: GCC 12's bug 105593.)
  constexpr __mmask16 all = 0xFFFF;
  const int64_t full = cols - cols % 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (cols - full)) - 1);
  __m512 amax = _mm512_setzero_ps(), nonfinite = _mm512_setzero_ps();
  for (int64_t i = 0; i <= full; i += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(i < full ? all : tail, x + i);
    amax = _mm512_maskz_max_ps(all, amax, _mm512_abs_ps(v));
    nonfinite = _mm512_maskz_add_ps(all, nonfinite, _mm512_maskz_sub_ps(all, v, v));
  }
  alignas(64) float lanes[16], holes[16];
  _mm512_store_ps(lanes, amax);
  _mm512_store_ps(holes, nonfinite);
  const float s = int8_scale(lanes, holes, 16, xq, cols, sum);
  if (s != s) return s;  // NaN or inf in x
  const __m512 sv = _mm512_set1_ps(s), hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
  __m512i total = _mm512_setzero_si512();
  for (int64_t i = 0; i <= full; i += 16) {
    const __mmask16 k = i < full ? all : tail;
    if (!k) break;
    const __m512 v = _mm512_maskz_roundscale_ps(all, _mm512_maskz_div_ps(all, _mm512_maskz_loadu_ps(k, x + i), sv),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i q =
        _mm512_maskz_cvttps_epi32(all, _mm512_maskz_min_ps(all, _mm512_maskz_max_ps(all, v, lo), hi));
    _mm512_mask_cvtepi32_storeu_epi8(xq + i, k, q);
    total = _mm512_add_epi32(total, q);
  }
  alignas(64) int32_t parts[16];
  _mm512_store_si512(parts, total);
  int32_t t = 0;
  for (int k = 0; k < 16; ++k) t += parts[k];
  *sum = t;
  return s;
}

// The same in AVX2, the same bits: 8 values a step, the last < 8 through a zero-padded copy (its
// zeros change neither the largest |x| nor the sums, and their bytes are not stored).
__attribute__((target("avx2,fma")))
float quantize_row_int8_avx2(const float* __restrict x, int64_t cols, int8_t* __restrict xq, int32_t* sum) {
  const int64_t full = cols - cols % 8;
  alignas(32) float last[8] = {};
  std::copy(x + full, x + cols, last);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 amax = _mm256_setzero_ps(), nonfinite = _mm256_setzero_ps();
  for (int64_t i = 0; i <= full; i += 8) {
    const __m256 v = _mm256_loadu_ps(i < full ? x + i : last);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v));
    nonfinite = _mm256_add_ps(nonfinite, _mm256_sub_ps(v, v));
  }
  alignas(32) float lanes[8], holes[8];
  _mm256_store_ps(lanes, amax);
  _mm256_store_ps(holes, nonfinite);
  const float s = int8_scale(lanes, holes, 8, xq, cols, sum);
  if (s != s) return s;  // NaN or inf in x
  const __m256 sv = _mm256_set1_ps(s), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
  __m256i total = _mm256_setzero_si256();
  for (int64_t i = 0; i <= full; i += 8) {
    const __m256 v = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(i < full ? x + i : last), sv),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i q = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(v, lo), hi));
    total = _mm256_add_epi32(total, q);
    // 8 int32 -> 8 bytes: packs within 128-bit halves, so the halves' 4 bytes are joined after
    const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    const __m128i bytes = _mm_packs_epi16(words, words);
    if (i < full) _mm_storel_epi64(reinterpret_cast<__m128i*>(xq + i), bytes);
    else {
      alignas(16) int8_t tail[16];
      _mm_store_si128(reinterpret_cast<__m128i*>(tail), bytes);
      std::copy(tail, tail + (cols - full), xq + i);
    }
  }
  alignas(32) int32_t parts[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(parts), total);
  int32_t t = 0;
  for (int k = 0; k < 8; ++k) t += parts[k];
  *sum = t;
  return s;
}
#endif

}  // namespace

// The AVX-512 or AVX2 version unless NANOGPT_KERNELS=portable.
float quantize_row_int8(const float* __restrict x, int64_t cols, int8_t* __restrict xq, int32_t* sum) {
#if NANOGPT_X86_INTRINSICS
  if (avx512_kernels()) return quantize_row_int8_avx512(x, cols, xq, sum);
  if (avx2_kernels()) return quantize_row_int8_avx2(x, cols, xq, sum);
#endif
  return quantize_row_int8_portable(x, cols, xq, sum);
}

void quantize_rows_int8(const float* w, int64_t rows, int64_t cols, uint8_t* q, float* scale) {
  std::vector<int8_t> row(cols);  // the same rule as each product's input (NaN scale and zeros for a damaged row)
  for (int64_t r = 0; r < rows; ++r) {
    int32_t sum = 0;
    scale[r] = quantize_row_int8(w + r * cols, cols, row.data(), &sum);
    for (int64_t i = 0; i < cols; ++i) q[r * cols + i] = static_cast<uint8_t>(row[i] + 128);
  }
}

void matvec_rows(const Int8Rows& w, const float* __restrict x, int64_t x_stride, int64_t B, int64_t cols,
                 int64_t r0, int64_t r1, float* __restrict y, int64_t y_stride, bool accumulate) {
  thread_local AlignedVector<int8_t> xq;  // each thread quantizes x itself: no barrier for it
  thread_local std::vector<float> xs;
  thread_local std::vector<int32_t> xsum;
  xq.resize(B * cols);
  xs.resize(B);
  xsum.resize(B);
  for (int64_t b = 0; b < B; ++b) xs[b] = quantize_row_int8(x + b * x_stride, cols, xq.data() + b * cols, &xsum[b]);
#if NANOGPT_X86_INTRINSICS
  if (vnni_kernels())
    return matvec_rows_int8_vnni(w, xq.data(), xs.data(), xsum.data(), B, cols, r0, r1, y, y_stride, accumulate);
  if (avx2_kernels())
    return matvec_rows_int8_avx2(w, xq.data(), xs.data(), xsum.data(), B, cols, r0, r1, y, y_stride, accumulate);
#endif
  matvec_rows_int8_portable(w, xq.data(), xs.data(), xsum.data(), B, cols, r0, r1, y, y_stride, accumulate);
}

}  // namespace nanogpt::model
