// Cross-entropy over a large vocabulary one logit at a time, in fp32 from the logits' own dtype: the
// arithmetic of the CUDA kernels (cross_entropy_kernel.cu), written once for the device and the
// host, so that the CPU form of the plugin's entry (a plain loop, cross_entropy_kernel.cpp) runs the
// same lines where there is no GPU. Legend: N rows (B * T), V vocabulary; x a row of logits
// (fp32, bf16 or fp16), t its target (-100: ignored), n the number of rows not ignored.
//
// Forward, per row: lse = log Σ_v exp(x_v), as an online softmax (a running maximum m and the sum s
// of exp(x_v - m), rescaled when m grows: one read of the row); the row's loss lse - x_t; the loss
// the mean over the n rows not ignored (NaN when n = 0, as LibTorch).
// Backward, per logit, with g the gradient arriving at the loss:
//   d loss / d x_v = (softmax(x)_v - [v = t]) g / n = (exp(x_v - lse) - [v = t]) g / n,
// written straight in the logits' dtype: no fp32 copy of the (N, V) logits, nor of their gradient,
// ever exists (at V = 50,304 and N = 12,288, 2.5 GB each).
#pragma once

#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

namespace nanogpt::model::cuda {

constexpr int64_t kCrossEntropyIgnore = -100;  // LibTorch's default ignore_index

C10_HOST_DEVICE inline float exp_of(float v) {
#ifdef __CUDA_ARCH__
  return expf(v);
#else
  return std::exp(v);
#endif
}

C10_HOST_DEVICE inline float log_of(float v) {
#ifdef __CUDA_ARCH__
  return logf(v);
#else
  return std::log(v);
#endif
}

/// A running (maximum, Σ exp(x - maximum)) over some logits; the empty one is (-inf, 0).
struct SoftmaxSum {
  float max, sum;
};

/// Adds logit x to the running sum.
C10_HOST_DEVICE inline SoftmaxSum softmax_add(SoftmaxSum a, float x) {
  if (x == -HUGE_VALF) return a;  // exp(-inf) adds nothing
  if (x > a.max) return {x, a.sum * exp_of(a.max - x) + 1.0f};
  return {a.max, a.sum + exp_of(x - a.max)};
}

/// The running sum of two sets of logits.
C10_HOST_DEVICE inline SoftmaxSum softmax_merge(SoftmaxSum a, SoftmaxSum b) {
  if (b.sum == 0.0f) return a;
  if (a.sum == 0.0f) return b;
  return a.max >= b.max ? SoftmaxSum{a.max, a.sum + b.sum * exp_of(b.max - a.max)}
                        : SoftmaxSum{b.max, b.sum + a.sum * exp_of(a.max - b.max)};
}

/// log Σ exp(x) of the logits summed in a.
C10_HOST_DEVICE inline float log_sum_exp(SoftmaxSum a) { return a.max + log_of(a.sum); }

/// The gradient at logit x of a row whose log-sum-exp is lse: (exp(x - lse) - [target]) scale,
/// scale = g / n.
C10_HOST_DEVICE inline float cross_entropy_grad(float x, float lse, bool is_target, float scale) {
  return (exp_of(x - lse) - (is_target ? 1.0f : 0.0f)) * scale;
}

/// The kernels' tensors. T: float, c10::BFloat16 or c10::Half.
template <class T>
struct CrossEntropyRows {
  const T* logits;         // (N, V), rows packed
  const int64_t* targets;  // (N,)
  float* lse;              // (N,): the rows' log-sum-exp (0 for an ignored row)
  float* row_loss;         // (N,): lse - x_t (0 for an ignored row; NaN for a target outside [0, V))
};

/// Forward: lse and row_loss of rows 0 .. N - 1 (one launch), then loss = Σ row_loss / n and
/// count = n (one launch; loss and count device scalars). Backward: grad (N, V) in T from the
/// forward's lse, the incoming gradient *grad_loss and *count (one launch; read on the device, so
/// nothing syncs the host). Throw c10::Error when a launch fails.
template <class T>
void launch_cross_entropy_forward(const CrossEntropyRows<T>& t, float* loss, float* count, int64_t N, int64_t V,
                                  cudaStream_t stream);
template <class T>
void launch_cross_entropy_backward(const CrossEntropyRows<T>& t, const float* grad_loss, const float* count, T* grad,
                                   int64_t N, int64_t V, cudaStream_t stream);

}  // namespace nanogpt::model::cuda
