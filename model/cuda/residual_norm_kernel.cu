// A block's residual add + dropout + LayerNorm / RMSNorm on a GPU, one kernel each way
// (residual_norm_kernel_math.h has the arithmetic and the backward's derivation; residual_norm_kernel.cpp
// the autograd wrapper). One warp per row: lane l holds columns 4 (l + 32 g) .. + 3 for g < kGroups,
// in registers, so that the row is read once, its mean and variance are warp sums, and each lane's
// four neighbouring elements share one Philox draw. The backward's warps walk rows with a stride,
// summing dw and db in registers, then add them up per block in a fixed order (deterministic).
#include "model/cuda/residual_norm_kernel_math.h"

#include <ATen/cuda/PhiloxUtils.cuh>
#include <c10/cuda/CUDAException.h>

namespace nanogpt::model::cuda {
namespace {

constexpr int kForwardWarps = 4;   // rows per forward block
constexpr int kBackwardWarps = 8;  // warps per backward block

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

template <class Y, int kGroups>
__global__ void residual_norm_forward_kernel(ResidualNormForward<Y> t, at::PhiloxCudaState philox, DropoutStream d,
                                             int64_t N, int C) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kForwardWarps + threadIdx.x / 32;
  uint64_t seed = 0, offset = 0;
  if (d.rng) {
    const auto state = at::cuda::philox::unpack(philox);  // read now: under a CUDA graph, at each replay
    seed = std::get<0>(state);
    offset = std::get<1>(state);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      d.rng[0] = static_cast<int64_t>(seed);
      d.rng[1] = static_cast<int64_t>(offset);
    }
  }
  if (row >= N) return;
  const float* x = t.x.row(row, C);
  const Y* y = t.y.row(row, C);
  float* h = t.h.row(row, C);
  float hv[kGroups][4];
  float sum = 0.0f;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const int col = 4 * (lane + 32 * g);
    if (col >= C) break;
    const Keep4 kept = kept_of(d, seed, offset, static_cast<uint64_t>(row * C + col) / 4);
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      hv[g][v] = residual_sum(x[col + v], static_cast<float>(y[col + v]), kept.v[v], d.scale);
      h[col + v] = hv[g][v];
      sum += hv[g][v];
    }
  }
  if (!t.weight) return;
  const float mean = t.rms ? 0.0f : warp_sum(sum) / C;
  float square = 0.0f;
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    if (4 * (lane + 32 * g) >= C) break;
#pragma unroll
    for (int v = 0; v < 4; ++v) square += (hv[g][v] - mean) * (hv[g][v] - mean);
  }
  const float rstd = inverse_std(warp_sum(square) / C, t.eps);
  float* n = t.n.row(row, C);
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const int col = 4 * (lane + 32 * g);
    if (col >= C) break;
#pragma unroll
    for (int v = 0; v < 4; ++v)
      n[col + v] = normalised(hv[g][v], mean, rstd, t.weight[col + v], t.bias ? t.bias[col + v] : 0.0f);
  }
  if (lane == 0) {
    t.mean[row] = mean;
    t.rstd[row] = rstd;
  }
}

template <class Y, int kGroups>
__global__ void residual_norm_backward_kernel(ResidualNormBackward<Y> t, DropoutStream d, int64_t N, int C) {
  __shared__ float block_sums[2 * kMaxResidualNormC];  // dw then db, summed warp by warp
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const uint64_t seed = d.rng ? static_cast<uint64_t>(d.rng[0]) : 0, offset = d.rng ? static_cast<uint64_t>(d.rng[1]) : 0;
  float dw[kGroups][4] = {}, db[kGroups][4] = {};
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kBackwardWarps + warp; row < N;
       row += static_cast<int64_t>(gridDim.x) * kBackwardWarps) {
    const float* dh_out = t.dh_out.row(row, C);
    const float* dn = t.dn.row(row, C);
    float dh[kGroups][4] = {};
    if (t.weight) {
      const float* h = t.h.row(row, C);
      const float mean = t.mean[row], rstd = t.rstd[row];
      float hhat[kGroups][4], grad[kGroups][4], sum_g = 0.0f, sum_gh = 0.0f;
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        const int col = 4 * (lane + 32 * g);
        if (col >= C) break;
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          const float dnv = dn ? dn[col + v] : 0.0f;
          hhat[g][v] = (h[col + v] - mean) * rstd;
          grad[g][v] = dnv * t.weight[col + v];
          sum_g += grad[g][v];
          sum_gh += grad[g][v] * hhat[g][v];
          dw[g][v] += dnv * hhat[g][v];
          db[g][v] += dnv;
        }
      }
      const float mean_g = t.rms ? 0.0f : warp_sum(sum_g) / C, mean_gh = warp_sum(sum_gh) / C;
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        const int col = 4 * (lane + 32 * g);
        if (col >= C) break;
#pragma unroll
        for (int v = 0; v < 4; ++v)
          dh[g][v] = normalised_grad(dh_out ? dh_out[col + v] : 0.0f, grad[g][v], hhat[g][v], rstd, mean_g, mean_gh);
      }
    } else {
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        const int col = 4 * (lane + 32 * g);
        if (col >= C) break;
#pragma unroll
        for (int v = 0; v < 4; ++v) dh[g][v] = dh_out ? dh_out[col + v] : 0.0f;
      }
    }
    float* dx = t.dx.row(row, C);
    Y* dy = t.dy.row(row, C);
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const int col = 4 * (lane + 32 * g);
      if (col >= C) break;
      const Keep4 kept = kept_of(d, seed, offset, static_cast<uint64_t>(row * C + col) / 4);
#pragma unroll
      for (int v = 0; v < 4; ++v) {
        dx[col + v] = dh[g][v];
        dy[col + v] = static_cast<Y>(kept.v[v] ? dh[g][v] * d.scale : 0.0f);
      }
    }
  }
  if (!t.weight) return;  // the same for every thread of the block
  for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) block_sums[i] = 0.0f;
  __syncthreads();
  for (int w = 0; w < kBackwardWarps; ++w) {  // one warp at a time: the same sums at every run
    if (warp == w) {
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        const int col = 4 * (lane + 32 * g);
        if (col >= C) break;
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          block_sums[col + v] += dw[g][v];
          block_sums[C + col + v] += db[g][v];
        }
      }
    }
    __syncthreads();
  }
  float* out = t.dw_db + static_cast<int64_t>(blockIdx.x) * 2 * C;
  for (int i = threadIdx.x; i < 2 * C; i += blockDim.x) out[i] = block_sums[i];
}

// Calls f with the kGroups that covers C (C <= 128 kGroups).
template <class F>
void with_groups(int64_t C, F&& f) {
  if (C <= 128) return f(std::integral_constant<int, 1>{});
  if (C <= 256) return f(std::integral_constant<int, 2>{});
  if (C <= 512) return f(std::integral_constant<int, 4>{});
  return f(std::integral_constant<int, 8>{});
}

}  // namespace

template <class Y>
void launch_residual_norm_forward(const ResidualNormForward<Y>& t, at::PhiloxCudaState philox, DropoutStream dropout,
                                  int64_t N, int64_t C, cudaStream_t stream) {
  if (N == 0) return;
  const auto blocks = static_cast<unsigned>((N + kForwardWarps - 1) / kForwardWarps);
  with_groups(C, [&](auto groups) {
    residual_norm_forward_kernel<Y, decltype(groups)::value>
        <<<blocks, 32 * kForwardWarps, 0, stream>>>(t, philox, dropout, N, static_cast<int>(C));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <class Y>
void launch_residual_norm_backward(const ResidualNormBackward<Y>& t, DropoutStream dropout, int64_t N, int64_t C,
                                   int64_t backward_blocks, cudaStream_t stream) {
  if (backward_blocks == 0) return;
  with_groups(C, [&](auto groups) {
    residual_norm_backward_kernel<Y, decltype(groups)::value>
        <<<static_cast<unsigned>(backward_blocks), 32 * kBackwardWarps, 0, stream>>>(t, dropout, N, static_cast<int>(C));
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

#define NANOGPT_RESIDUAL_NORM(Y)                                                                                     \
  template void launch_residual_norm_forward<Y>(const ResidualNormForward<Y>&, at::PhiloxCudaState, DropoutStream,  \
                                                int64_t, int64_t, cudaStream_t);                                   \
  template void launch_residual_norm_backward<Y>(const ResidualNormBackward<Y>&, DropoutStream, int64_t, int64_t,   \
                                                 int64_t, cudaStream_t);
NANOGPT_RESIDUAL_NORM(float)
NANOGPT_RESIDUAL_NORM(c10::BFloat16)
NANOGPT_RESIDUAL_NORM(c10::Half)
#undef NANOGPT_RESIDUAL_NORM

}  // namespace nanogpt::model::cuda
