// What the AVX-512 intrinsics kernels share (matvec.cpp, int4_tiles.cpp, decode_attention.cpp,
// gelu.cpp): 16 values loaded as fp32. x86-64 with GCC-compatible compilers only; callers keep a
// portable path.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include <cstdint>

namespace nanogpt::model {

/// 16 values from p as fp32: fp32 loaded, bf16 (raw bits) widened exactly (a zero-extend and a
/// shift), or int8 converted. The all-ones masked forms: GCC 12 warns that the unmasked ones'
/// undefined pass-through may be used uninitialised (its bug 105593).
__attribute__((target("avx512f"), always_inline)) inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
__attribute__((target("avx512f"), always_inline)) inline __m512 load16(const uint16_t* p) {
  constexpr __mmask16 all = 0xFFFF;
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(all, _mm512_maskz_cvtepu16_epi32(all, bits), 16));
}

__attribute__((target("avx512f"), always_inline)) inline __m512 load16(const int8_t* p) {
  constexpr __mmask16 all = 0xFFFF;
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_maskz_cvtepi32_ps(all, _mm512_maskz_cvtepi8_epi32(all, bytes));
}

}  // namespace nanogpt::model
#endif
