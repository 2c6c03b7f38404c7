// A block's residual add, dropout and LayerNorm / RMSNorm one element at a time: the arithmetic of the
// CUDA kernels (residual_norm_kernel.cu), written once for the device and the host, so that the CPU
// form of the plugin's entry (a plain loop, residual_norm_kernel.cpp) runs the same lines where there
// is no GPU. Legend: N rows (B * T), C channels; x the residual stream (N, C) fp32, y the branch's
// output (N, C) fp32, bf16 or fp16, p the dropout probability, s = 1 / (1 - p).
//
// Forward, per row:   h = x + m ⊙ y s          (m the keep mask: 1 kept, 0 dropped)
//                     ĥ = (h - μ) r,  μ = mean(h), r = 1 / sqrt(mean((h - μ)²) + eps)     (LayerNorm)
//                     ĥ = h r,        r = 1 / sqrt(mean(h²) + eps)                        (RMSNorm: μ = 0)
//                     n = ĥ ⊙ w + b   (no b for RMSNorm)
// Backward, with dh_out the gradient arriving at h (the residual stream) and dn at n; g = dn ⊙ w:
//   LayerNorm:  dh = dh_out + r (g - mean(g) - ĥ mean(g ⊙ ĥ))
//   RMSNorm:    dh = dh_out + r (g - ĥ mean(g ⊙ ĥ))
//   dx = dh,   dy = m ⊙ dh s,   dw = Σ_rows dn ⊙ ĥ,   db = Σ_rows dn.
// Only h, μ and r per row and the dropout's (seed, offset) are kept for backward: the mask is drawn
// again from them (never stored), as model/fast/dropout.h does on the CPU.
//
// The mask: element e = row * C + col (C a multiple of 4) is kept when its 32-bit draw is >= p 2³²,
// the draws of elements 4k .. 4k + 3 being the four words of Philox4x32-10 (Salmon et al. 2011, the
// generator of cuRAND and of LibTorch's CUDA dropout) at counter (k, offset) under key (seed, ~0):
// a pure function of (seed, offset, e), which the CUDA generator hands out graph-safely (its seed and
// offset read by the kernel when a CUDA graph replays, runtime/cuda_plugin.h's capture_graph).
#pragma once

#include <ATen/cuda/PhiloxCudaState.h>
#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>

namespace nanogpt::model::cuda {

/// Four 32-bit words of Philox4x32-10 at counter (c0, c1, c2, c3) under key (k0, k1) (Random123's
/// philox4x32 with 10 rounds).
struct Philox4 {
  uint32_t v[4];
};

C10_HOST_DEVICE inline Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                             uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0, p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  return {{c0, c1, c2, c3}};
}

/// The draws of elements 4 word .. 4 word + 3 of the dropout stream (seed, offset).
C10_HOST_DEVICE inline Philox4 dropout_draws(uint64_t seed, uint64_t offset, uint64_t word) {
  return philox4x32_10(static_cast<uint32_t>(word), static_cast<uint32_t>(word >> 32), static_cast<uint32_t>(offset),
                       static_cast<uint32_t>(offset >> 32), static_cast<uint32_t>(seed),
                       static_cast<uint32_t>(seed >> 32) ^ 0xFFFFFFFFu);  // a key of its own, not cuRAND's
}

/// The draw threshold of dropout probability p: an element is kept when its draw is >= it.
inline uint32_t dropout_threshold(double p) {
  const double t = std::nearbyint(p * 4294967296.0);
  return t >= 4294967295.0 ? 4294967295u : static_cast<uint32_t>(t);
}

/// The dropout of one launch: p, the kept elements' factor s, its threshold, and where the stream's
/// (seed, offset) are read: two int64 in device (or, for the host loop, host) memory. `rng` null is
/// no dropout.
struct DropoutStream {
  int64_t* rng;  // {seed, offset}
  uint32_t threshold;
  float scale;  // 1 / (1 - p); 1 without dropout
};

/// Whether elements 4 word .. 4 word + 3 keep their y (all of them without dropout).
struct Keep4 {
  bool v[4];
};
C10_HOST_DEVICE inline Keep4 kept_of(const DropoutStream& d, uint64_t seed, uint64_t offset, uint64_t word) {
  Keep4 k{{true, true, true, true}};
  if (!d.rng) return k;
  const Philox4 draws = dropout_draws(seed, offset, word);
  for (int v = 0; v < 4; ++v) k.v[v] = draws.v[v] >= d.threshold;
  return k;
}

/// h = x + m y s for one element, in fp32 (h rounded once where it is stored).
C10_HOST_DEVICE inline float residual_sum(float x, float y, bool kept, float scale) {
  return kept ? x + y * scale : x;
}

/// n = (h - μ) r w + b of one element (RMSNorm: μ = 0, b = 0).
C10_HOST_DEVICE inline float normalised(float h, float mean, float rstd, float w, float b) {
  return (h - mean) * rstd * w + b;
}

/// r = 1 / sqrt(v + eps), v the row's variance (LayerNorm) or mean square (RMSNorm).
C10_HOST_DEVICE inline float inverse_std(float v, float eps) {
#ifdef __CUDA_ARCH__
  return rsqrtf(v + eps);
#else
  return 1.0f / std::sqrt(v + eps);
#endif
}

/// dh of one element: dh_out + r (g - mean_g - ĥ mean_gh), g = dn w, ĥ = (h - μ) r; RMSNorm passes
/// mean_g = 0 (and μ = 0).
C10_HOST_DEVICE inline float normalised_grad(float dh_out, float g, float hhat, float rstd, float mean_g,
                                             float mean_gh) {
  return dh_out + rstd * (g - mean_g - hhat * mean_gh);
}

/// N rows of C values, each row packed; one of the kernel's tensors (or null: a gradient that never
/// arrived, read as zeros).
template <class T>
struct Rows {
  T* data;
  C10_HOST_DEVICE T* row(int64_t r, int64_t C) const { return data ? data + r * C : nullptr; }
};

/// The forward's tensors: x, y in; h, n, μ, r out (n, μ, r null without a norm). Y: float, c10::BFloat16
/// or c10::Half; every other tensor fp32.
template <class Y>
struct ResidualNormForward {
  Rows<const float> x;
  Rows<const Y> y;
  const float* weight;  // (C,), null: no norm
  const float* bias;    // (C,) or null
  Rows<float> h, n;
  float* mean;  // (N,), zeros for RMSNorm
  float* rstd;  // (N,)
  float eps;
  bool rms;
};

/// The backward's tensors: dh_out, dn, h, μ, r in; dx, dy and per-launch-block partial sums of dw and
/// db out (dw_db: (blocks, 2, C), a row of dw then one of db per block; the host sums them).
template <class Y>
struct ResidualNormBackward {
  Rows<const float> dh_out, dn, h;
  const float* mean;
  const float* rstd;
  const float* weight;  // null: no norm (dh = dh_out)
  Rows<float> dx;
  Rows<Y> dy;
  float* dw_db;
  bool rms;
};

/// One launch on `stream` of each: rows 0 .. N - 1 of C channels, C a multiple of 4 and at most
/// kMaxResidualNormC. Throws c10::Error when the launch fails. Instantiated for Y = float,
/// c10::BFloat16, c10::Half. The forward's dropout (when dropout.rng is not null) reads its (seed,
/// offset) from `philox` as the kernel runs (graph-safe) and writes them to dropout.rng for the
/// backward. `backward_blocks` is the number of rows of dw_db.
constexpr int64_t kMaxResidualNormC = 1024;
template <class Y>
void launch_residual_norm_forward(const ResidualNormForward<Y>& t, at::PhiloxCudaState philox, DropoutStream dropout,
                                  int64_t N, int64_t C, cudaStream_t stream);
template <class Y>
void launch_residual_norm_backward(const ResidualNormBackward<Y>& t, DropoutStream dropout, int64_t N, int64_t C,
                                   int64_t backward_blocks, cudaStream_t stream);

}  // namespace nanogpt::model::cuda
