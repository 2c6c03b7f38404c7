// The dot product of the hand-written CPU kernels (decode_attention.cpp, decoder.cpp): partial sums
// in kLanes independent lanes, which the compiler vectorises without reassociating (no -ffast-math),
// so it runs at the vector width of whichever target_clones variant inlines it.
#pragma once

#include <cstdint>

namespace nanogpt::model {

constexpr int64_t kLanes = 16;  // independent partial sums: one AVX-512 register

/// a · b over n floats.
inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  const int64_t full = n - n % kLanes;
  float lanes[kLanes] = {};
  for (int64_t i = 0; i < full; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) lanes[j] += a[i + j] * b[i + j];
  float s = 0.0f;
  for (int64_t j = 0; j < kLanes; ++j) s += lanes[j];
  for (int64_t i = full; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace nanogpt::model
