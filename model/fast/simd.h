// What the hand-written CPU loops share (cross_entropy.cpp, dropout.cpp, decoder.cpp,
// decode_attention.cpp): one binary built for several instruction sets, bf16 as its raw 16 bits, and
// exp and GELU without library calls. The loops are plain C++ that GCC vectorises; a call to libm's
// expf or erff, or c10::BFloat16's converting constructor (it branches on NaN), keeps it from doing
// so, hence the branch-free versions here.
#pragma once

#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include "model/fast/kernel_choice.h"

/// Builds a function for AVX-512, AVX2 and baseline x86-64, picked when the program loads by CPU
/// feature (the baseline build alone would stop at SSE2, a quarter of AVX-512's width), or for
/// AVX-512, AVX + FMA and the baseline (NANOGPT_FMA_CLONES), or AVX + FMA and the baseline
/// (NANOGPT_FMA_ONLY_CLONES). By ISA, not CPU model (`arch=` tests for one vendor's models: an AMD
/// CPU with AVX-512 got the plain variant). Elsewhere (64-bit Arm, clang) each is one plain build.
/// Each has a `_AVX2` twin built for AVX2 and FMA together, which a CPU with both and without
/// AVX-512 runs (kernel_choice.h): a clone can name one of them only, and an "fma" build has AVX's
/// 256-bit floats without AVX2's 256-bit integers, so GCC left exp's 2^n (an integer shift) and every
/// loop over it scalar there.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define NANOGPT_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define NANOGPT_FMA_CLONES __attribute__((target_clones("avx512f", "fma", "default")))
#define NANOGPT_FMA_ONLY_CLONES __attribute__((target_clones("fma", "default")))
#define NANOGPT_SIMD_CLONES_AVX2 __attribute__((target("avx2,fma")))
#define NANOGPT_FMA_CLONES_AVX2 __attribute__((target("avx2,fma")))
#define NANOGPT_FMA_ONLY_CLONES_AVX2 __attribute__((target("avx2,fma")))
#else
#define NANOGPT_SIMD_CLONES
#define NANOGPT_FMA_CLONES
#define NANOGPT_FMA_ONLY_CLONES
#define NANOGPT_SIMD_CLONES_AVX2
#define NANOGPT_FMA_CLONES_AVX2
#define NANOGPT_FMA_ONLY_CLONES_AVX2
#endif

/// For the helpers a kernel's body calls: inlined into each of its builds, whatever GCC's size
/// heuristics say (an out-of-line copy is built for the baseline, SSE2 on x86-64, and every build
/// would call it).
#if defined(__GNUC__)
#define NANOGPT_INLINE inline __attribute__((always_inline))
#else
#define NANOGPT_INLINE inline
#endif

/// A kernel written once and built three times: with `clones` (one of the macros above), for AVX2 +
/// FMA (`clones`_AVX2), and for the baseline alone, as `name##_clones`, `name##_avx2` and
/// `name##_baseline`; `name` calls the second on a CPU with AVX2 and FMA but no AVX-512 and under
/// NANOGPT_KERNELS=avx2, the third under NANOGPT_KERNELS=portable (kernel_choice.h), the first
/// otherwise, so one machine runs the code other CPUs run. `params` and `args` are parenthesised
/// lists; the body follows in braces. What the body calls must be inlined into each build
/// (NANOGPT_INLINE): an out-of-line helper is built once, for the baseline.
#define NANOGPT_KERNEL(clones, ret, name, params, args, ...)                                     \
  clones ret name##_clones params __VA_ARGS__                                                    \
  clones##_AVX2 ret name##_avx2 params __VA_ARGS__                                               \
  ret name##_baseline params __VA_ARGS__                                                         \
  ret name params {                                                                              \
    if (!simd_kernels()) return name##_baseline args;                                            \
    return simd_capped_at_avx2() ? name##_avx2 args : name##_clones args;                        \
  }

namespace nanogpt::model {

/// An allocator whose blocks start on a 64-byte cache line, for the kernels' buffers: a 64-byte
/// vector load from a row that starts on a line never straddles two (malloc gives 16-byte alignment,
/// and a 16-row batched product from such a buffer ran ~20% slower).
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) { ::operator delete(p, kAlign); }
  template <typename U>
  bool operator==(const CacheLineAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const CacheLineAllocator<U>&) const { return false; }
};
template <typename T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

/// The float a bf16 holds (exact: bf16 is float's upper half).
NANOGPT_INLINE float bf16_bits_to_float(uint16_t bf16) {
  const uint32_t bits = static_cast<uint32_t>(bf16) << 16;
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

/// v rounded to the nearest bf16, ties to even, as c10::BFloat16 rounds; any NaN becomes the quiet
/// NaN 0x7FC0. Branch-free: the NaN test is on the integer bits (a float compare keeps GCC from
/// if-converting).
NANOGPT_INLINE uint16_t float_to_bf16_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(nan ? 0x7FC0u : rounded);
}

/// Element access in fp32 for the loops that take several dtypes: fp32 as is, bf16 as its raw bits,
/// int8 as its integer.
NANOGPT_INLINE float load_float(float v) { return v; }
NANOGPT_INLINE float load_float(uint16_t bf16) { return bf16_bits_to_float(bf16); }
NANOGPT_INLINE float load_float(int8_t v) { return static_cast<float>(v); }
NANOGPT_INLINE void store_float(float v, float* out) { *out = v; }
NANOGPT_INLINE void store_float(float v, uint16_t* bf16) { *bf16 = float_to_bf16_bits(v); }

/// A bf16 tensor's data as the raw 16-bit words the loops take.
inline const uint16_t* bits(const c10::BFloat16* p) { return reinterpret_cast<const uint16_t*>(p); }
inline uint16_t* bits(c10::BFloat16* p) { return reinterpret_cast<uint16_t*>(p); }

/// exp(x) for x <= 0.34 (a little past 0, for the sums of rounded terms that should be 0) within
/// ~2 ulp: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by Cephes' expf polynomial, 2^n built in the
/// exponent bits. x is clamped at -87.3 (2^n stays a normal float): exp(-87.3) ~ 1e-38 is far under
/// any sum it joins.
NANOGPT_INLINE float exp_nonpositive(float x) {
  x = x < -87.3f ? -87.3f : x;
  const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;  // round(x / ln2): 1.5 * 2^23 drops the fraction
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;      // x - n ln2, ln2 split so n * 0.693359375 is exact
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n, n in [-126, 0]. A NaN x (non-finite logits) passes the clamp and stays NaN in p; its n
  // becomes 0 here so the integer conversion and the shift stay defined (UBSan found the shift).
  const int32_t bits = (static_cast<int32_t>(n == n ? n : 0.0f) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return p * two_n;
}

/// tanh(y) within ~1e-6 relative (fp64 reference): |y| < 0.125 by its Taylor series to y^7 (the
/// next term is under 2e-9 relative there), above it as (1 - e) / (1 + e) with e = exp(-2|y|) <= 0.78
/// (no cancellation left), the sign put back. Branch-free, so a loop over it vectorises.
NANOGPT_INLINE float tanh_float(float y) {
  const float a = std::fabs(y);
  const float e = exp_nonpositive(-2.0f * a);
  const float large = std::copysign((1.0f - e) / (1.0f + e), y);
  const float y2 = y * y;
  const float small = y * (1.0f + y2 * (-0.333333333f + y2 * (0.133333333f + y2 * -0.0539682540f)));
  return a < 0.125f ? small : large;
}

/// Phi(v), the standard normal CDF (so GELU(v) = v Phi(v), the exact form of torch::gelu), within
/// 4e-7 absolute, and 2.3e-6 relative for v >= -5 (against fp64; fp32 libm's 0.5 (1 + erff(v / sqrt 2))
/// is no closer there, and cancels to 0 below -5.5). erfc(z), z = |v| / sqrt 2, comes from the
/// Chebyshev fit in Numerical Recipes (erfcc: t exp(-z^2 + P(t)), t = 1 / (1 + z/2), fractional error
/// < 1.2e-7 for every z >= 0); Phi(v) = 1 - erfc(z) / 2 for v >= 0 and erfc(z) / 2 below, so the
/// lower tail keeps its relative accuracy where 1 + erf(v / sqrt 2) would cancel.
NANOGPT_INLINE float normal_cdf(float v) {
  const float z = std::fabs(v) * 0.70710678f;
  const float t = 1.0f / (1.0f + 0.5f * z);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  const float half_erfc = 0.5f * t * exp_nonpositive(p - z * z);
  return v < 0.0f ? half_erfc : 1.0f - half_erfc;
}

/// The exact (erf) GELU, v Phi(v), as torch::gelu's default (accuracy: normal_cdf's).
NANOGPT_INLINE float gelu_erf(float v) { return v * normal_cdf(v); }

/// A softmax's two passes over fp32 scores (the loss's rows, attention's rows), inlined into the
/// caller's instruction-set clone. max_of: the largest of x[0..n) (-inf for n == 0; NaN entries are
/// skipped, and exp_shifted_sum carries them).
NANOGPT_INLINE float max_of(const float* x, int64_t n) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

/// e[i] = exp(x[i] - m) for m >= every x[i], returns their sum; e may be x.
NANOGPT_INLINE float exp_shifted_sum(const float* x, float m, float* e, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    const float v = exp_nonpositive(x[i] - m);
    e[i] = v;
    sum += v;
  }
  return sum;
}

}  // namespace nanogpt::model

