// What the AVX2 + FMA intrinsics kernels share (matvec.cpp, panels.cpp, int8_rows.cpp,
// int4_tiles.cpp, decode_attention.cpp, gelu.cpp), for CPUs without AVX-512 (laptops): 8 values
// loaded as fp32, bf16 widened and rounded by 16-bit shifts (no AVX512-BF16 here), and the sums of
// four registers' lanes. x86-64 with GCC-compatible compilers only; callers keep a portable path.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include <cstdint>

namespace nanogpt::model {

#define NANOGPT_AVX2 __attribute__((target("avx2,fma"), always_inline)) inline

/// 8 values from p as fp32: fp32 loaded, bf16 (raw bits) widened exactly (a zero-extend and a
/// 16-bit shift), or int8 converted.
NANOGPT_AVX2 __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
NANOGPT_AVX2 __m256 load8(const uint16_t* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}
NANOGPT_AVX2 __m256 load8(const int8_t* p) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}

/// v's 8 lanes rounded to bf16 as simd.h's float_to_bf16_bits (ties to even; any NaN becomes
/// 0x7FC0), each in the low 16 bits of its 32-bit lane.
NANOGPT_AVX2 __m256i bf16_round8(__m256 v) {
  const __m256i b = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7FFF)), odd), 16);
  // |v| > inf as integers (both positive as signed: a signed compare does)
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7FFFFFFF)),
                                         _mm256_set1_epi32(0x7F800000));
  return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), nan);
}

/// 16 values, lo then hi, rounded to bf16 into p.
NANOGPT_AVX2 void store16_bf16(uint16_t* p, __m256 lo, __m256 hi) {
  // packus packs within 128-bit halves: [lo 0-3, hi 0-3, lo 4-7, hi 4-7]; the permute restores order
  const __m256i packed = _mm256_packus_epi32(bf16_round8(lo), bf16_round8(hi));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_permute4x64_epi64(packed, 0xD8));
}

/// The lane sums of four registers a0..a3 (8 fp32 lanes each) -> s[0..3]: two rounds of horizontal
/// adds and one of the 128-bit halves, the same tree for every row.
NANOGPT_AVX2 __m128 sum_lanes4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));  // [0 1 2 3 | 0 1 2 3] halves
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
/// The same in int32 lanes (exact, in any order).
NANOGPT_AVX2 __m128i sum_lanes4(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

}  // namespace nanogpt::model
#endif
