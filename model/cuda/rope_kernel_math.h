// RoPE's rotation one channel pair at a time: the arithmetic of the CUDA kernel (rope_kernel.cu),
// written once for the device and the host, so that the CPU form of the plugin's entry (a plain
// loop, rope_kernel.cpp) runs the same lines where there is no GPU. Legend: B batch, T positions,
// H heads (queries first, then keys), hs head size, h = hs / 2; tables cos2 = [cos, cos] and
// sin2 = [-sin, sin] per position, fp32 (model::Rope's).
//
// Per pair (x1, x2) = (x[i], x[i + h]) at the angle φ = p θ_i of position p, the forward is the
// rotation y = R(φ) x:                     y1 = x1 cos φ - x2 sin φ,   y2 = x2 cos φ + x1 sin φ
// (y = x cos + rotate_half(x) sin, rotate_half(x) = [-x2, x1]). Its gradient is dx = R(φ)ᵀ dy, and a
// rotation is orthogonal, R(φ)ᵀ = R(-φ):   dx1 = dy1 cos φ + dy2 sin φ,   dx2 = dy2 cos φ - dy1 sin φ
// (dx = dy cos + rotate_halfᵀ(dy sin) = dy cos - rotate_half(dy) sin): the same kernel with sin
// negated, which needs nothing of x.
#pragma once

#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace nanogpt::model::cuda {

/// Rows of hs values, each packed, for every (b, t, head): the row of (b, t, head) starts at
/// data + b * stride_b + t * stride_t + head * stride_head (strides in elements). A null `data`
/// reads as zeros (a gradient that never arrived).
template <class T>
struct HeadRows {
  T* data;
  int64_t stride_b, stride_t, stride_head;

  C10_HOST_DEVICE T* row(int64_t b, int64_t t, int64_t head) const {
    return data ? data + b * stride_b + t * stride_t + head * stride_head : nullptr;
  }
};

/// H heads held in two places: heads [0, n_first) in `first`, heads [n_first, H) in `second` (whose
/// head 0 is head n_first). One tensor of all H heads is `first` with n_first = H.
template <class T>
struct SplitHeads {
  HeadRows<T> first, second;
  int64_t n_first;

  C10_HOST_DEVICE T* row(int64_t b, int64_t t, int64_t head) const {
    return head < n_first ? first.row(b, t, head) : second.row(b, t, head - n_first);
  }
};

/// Rotates pair i of one head's row, in -> out (fp32 arithmetic, rounded once to T), by the angle
/// whose table rows are cos2_row and sin2_row; `backward` turns it the other way (see above). A null
/// `in` is a row of zeros.
template <class T>
C10_HOST_DEVICE inline void rope_rotate_pair(bool backward, const T* in, T* out, const float* cos2_row,
                                             const float* sin2_row, int64_t i, int64_t h) {
  const float c = cos2_row[i];
  const float s = backward ? -sin2_row[i + h] : sin2_row[i + h];  // sin2's second half is +sin φ
  const float x1 = in ? static_cast<float>(in[i]) : 0.0f;
  const float x2 = in ? static_cast<float>(in[i + h]) : 0.0f;
  out[i] = static_cast<T>(x1 * c - x2 * s);
  out[i + h] = static_cast<T>(x2 * c + x1 * s);
}

/// One launch on `stream`: every pair of every head of every (b, t), in -> out, at positions
/// start .. start + Tn - 1 (table rows of hs floats). T: float, c10::BFloat16 or c10::Half.
/// Throws c10::Error when the launch fails.
template <class T>
void launch_rope_rotate(bool backward, const SplitHeads<const T>& in, const SplitHeads<T>& out, const float* cos2,
                        const float* sin2, int64_t start, int64_t B, int64_t Tn, int64_t H, int64_t hs,
                        cudaStream_t stream);

}  // namespace nanogpt::model::cuda
