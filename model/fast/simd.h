// What the hand-written CPU loops that work on bf16 share (cross_entropy.cpp, dropout.cpp): one
// binary built for several instruction sets, and bf16 as its raw 16 bits. The loops are plain C++
// that GCC vectorises; c10::BFloat16's converting constructor branches on NaN and keeps it from
// doing so, hence the bit-level conversions here.
#pragma once

#include <cstdint>
#include <cstring>

/// Builds a function for AVX-512, AVX2 and baseline x86-64, picked when the program loads by CPU
/// feature (the baseline build alone would stop at SSE2, a quarter of AVX-512's width).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define NANOGPT_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define NANOGPT_SIMD_CLONES
#endif

namespace nanogpt::model {

/// The float a bf16 holds (exact: bf16 is float's upper half).
inline float bf16_bits_to_float(uint16_t bf16) {
  const uint32_t bits = static_cast<uint32_t>(bf16) << 16;
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

/// v rounded to the nearest bf16, ties to even, as c10::BFloat16 rounds; any NaN becomes the quiet
/// NaN 0x7FC0. Branch-free: the NaN test is on the integer bits (a float compare keeps GCC from
/// if-converting).
inline uint16_t float_to_bf16_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(nan ? 0x7FC0u : rounded);
}

}  // namespace nanogpt::model
