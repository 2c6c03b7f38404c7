// What the weight-matrix products (matvec.cpp, panels.cpp, int8_rows.cpp, int4_tiles.cpp) share:
// NANOGPT_X86_INTRINSICS, set where their AVX-512 kernels compile (x86-64, GCC-compatible
// compilers); the four-row lane sums in plain C++ (fp32, or int32 for the int8 products) and the
// AVX-512 tree that adds four rows' lanes; bf16 pairs as AVX512-BF16's operand; and each product's
// input rounded to bf16. The inline pieces are always_inline: each compiles into the
// instruction-set variant of the kernel that calls it, in whichever file that kernel is.
#pragma once

#include <cstdint>
#include <type_traits>

#if defined(__x86_64__) && defined(__GNUC__)
#define NANOGPT_X86_INTRINSICS 1
#include <immintrin.h>
#else
#define NANOGPT_X86_INTRINSICS 0
#endif

#include "model/fast/dot.h"
#include "model/fast/simd.h"

namespace nanogpt::model {

// One element as the lane sums' type: fp32 (bf16 widened exactly by load_float) or int32 (a byte
// of the int8 products).
template <typename Acc, typename T>
NANOGPT_INLINE Acc widen(T v) {
  if constexpr (std::is_same_v<Acc, float>) return load_float(v);
  else return static_cast<Acc>(v);
}

// The lane sums in plain C++: independent lanes (as dot()) that GCC vectorises at whatever width
// the target_clones variant has; in fp32, or in int32 for the int8 products (exact).
struct LaneSums {
  static constexpr int64_t kStep = kLanes;
  static constexpr bool kTiles = false;
  template <typename W, typename X, typename Acc>
  NANOGPT_INLINE void operator()(const W* const (&w)[kRowBlock], const X* __restrict xb,
                                                        int64_t full, Acc (&s)[kRowBlock]) const {
    Acc a0[kLanes] = {}, a1[kLanes] = {}, a2[kLanes] = {}, a3[kLanes] = {};
    const W *__restrict w0 = w[0], *__restrict w1 = w[1], *__restrict w2 = w[2], *__restrict w3 = w[3];
    for (int64_t i = 0; i < full; i += kLanes)
      for (int64_t j = 0; j < kLanes; ++j) {
        const Acc xv = widen<Acc>(xb[i + j]);
        a0[j] += widen<Acc>(w0[i + j]) * xv;
        a1[j] += widen<Acc>(w1[i + j]) * xv;
        a2[j] += widen<Acc>(w2[i + j]) * xv;
        a3[j] += widen<Acc>(w3[i + j]) * xv;
      }
    for (int64_t k = 0; k < kRowBlock; ++k) s[k] = Acc{0};
    for (int64_t j = 0; j < kLanes; ++j) {
      s[0] += a0[j];
      s[1] += a1[j];
      s[2] += a2[j];
      s[3] += a3[j];
    }
  }
};

#if NANOGPT_X86_INTRINSICS
// The lanes' adds of sum_lanes: fp32, or int32 on the same 512 bits (the int8 products' sums).
struct AddFp32 {
  __attribute__((target("avx512f"), always_inline)) __m512 operator()(__m512 a, __m512 b) const {
    return _mm512_add_ps(a, b);
  }
};
struct AddInt32 {
  __attribute__((target("avx512f"), always_inline)) __m512 operator()(__m512 a, __m512 b) const {
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
  }
};

// The four rows' lane sums a0..a3 (16 lanes each) -> s[0..3]: a transpose-and-add tree, 9 shuffles
// and 6 adds for all four. (Lane by lane in scalar code, as LaneSums, was 64 dependent adds: about
// as many instructions as the FMAs of a 384-wide row, and most of those of a 64-wide key's score.)
// T and Add: fp32 lanes, or int32 lanes carried in the same registers (the shuffles only move bits).
template <typename T, typename Add = AddFp32>
__attribute__((target("avx512f"), always_inline)) inline void sum_lanes(__m512 a0, __m512 a1, __m512 a2, __m512 a3,
                                                                       T (&s)[kRowBlock], Add add = {}) {
  // (The all-ones masked forms, as load16() (avx512.h): GCC 12's bug 105593.)
  constexpr __mmask16 all = 0xFFFF;
  // 256-bit halves: u01 = [a0 lo + a0 hi | a1 lo + a1 hi], 8 partial sums of each row
  const __m512 u01 = add(_mm512_maskz_shuffle_f32x4(all, a0, a1, 0x44), _mm512_maskz_shuffle_f32x4(all, a0, a1, 0xEE));
  const __m512 u23 = add(_mm512_maskz_shuffle_f32x4(all, a2, a3, 0x44), _mm512_maskz_shuffle_f32x4(all, a2, a3, 0xEE));
  // 128-bit quarters: v = [row 0 | row 1 | row 2 | row 3], 4 partial sums each
  const __m512 v =
      add(_mm512_maskz_shuffle_f32x4(all, u01, u23, 0x88), _mm512_maskz_shuffle_f32x4(all, u01, u23, 0xDD));
  // within each quarter: 4 -> 2 -> 1
  const __m512 w = add(v, _mm512_maskz_permute_ps(all, v, 0x4E));
  const __m512 x = add(w, _mm512_maskz_permute_ps(all, w, 0xB1));
  alignas(64) T lanes[kLanes];
  _mm512_store_si512(lanes, _mm512_castps_si512(x));
  for (int64_t k = 0; k < kRowBlock; ++k) s[k] = lanes[4 * k];
}

// 32 bf16 (raw bits) from p as AVX512-BF16's operand: 16 lanes of two.
__attribute__((target("avx512f,avx512bf16"), always_inline)) inline __m512bh pairs(const uint16_t* p) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));  // 32 bf16: 16 lanes of two
}
#endif

/// out[b * out_stride + i] = x[b * x_stride + i] rounded to bf16 (simd.h's float_to_bf16_bits), for
/// B rows of `cols` values: the input of a product with bf16 weights, rounded as autocast rounds it.
void round_rows_to_bf16(const float* __restrict x, int64_t x_stride, int64_t B, int64_t cols, uint16_t* __restrict out,
                        int64_t out_stride);

}  // namespace nanogpt::model
