// Cross-entropy on a GPU without an fp32 copy of the logits (cross_entropy_kernel_math.h has the
// arithmetic; cross_entropy_kernel.cpp the autograd wrapper). One warp per row: its lanes read the row
// in 32-logit strides (coalesced), each keeping a running softmax sum, merged by shuffles. The mean
// is one block summing the rows in a fixed order (deterministic); the backward one warp per row again.
#include "model/cuda/cross_entropy_kernel_math.h"

#include <c10/cuda/CUDAException.h>

namespace nanogpt::model::cuda {
namespace {

constexpr int kWarps = 8;          // rows per block
constexpr int kReduceThreads = 1024;

template <class T>
__global__ void cross_entropy_rows_kernel(CrossEntropyRows<T> t, int64_t N, int64_t V) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= N) return;
  const int64_t target = t.targets[row];
  if (target == kCrossEntropyIgnore) {
    if (lane == 0) t.lse[row] = t.row_loss[row] = 0.0f;
    return;
  }
  const T* x = t.logits + row * V;
  SoftmaxSum sum{-HUGE_VALF, 0.0f};
  for (int64_t v = lane; v < V; v += 32) sum = softmax_add(sum, static_cast<float>(x[v]));
  for (int o = 16; o > 0; o >>= 1) {
    const SoftmaxSum other{__shfl_xor_sync(0xFFFFFFFFu, sum.max, o), __shfl_xor_sync(0xFFFFFFFFu, sum.sum, o)};
    sum = softmax_merge(sum, other);
  }
  if (lane != 0) return;
  const float lse = log_sum_exp(sum);
  t.lse[row] = lse;
  t.row_loss[row] = target >= 0 && target < V ? lse - static_cast<float>(x[target]) : NAN;
}

__global__ void cross_entropy_mean_kernel(const float* row_loss, const int64_t* targets, float* loss, float* count,
                                          int64_t N) {
  __shared__ float sums[kReduceThreads], counts[kReduceThreads];
  float s = 0.0f, c = 0.0f;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    s += row_loss[i];
    c += targets[i] != kCrossEntropyIgnore ? 1.0f : 0.0f;
  }
  sums[threadIdx.x] = s;
  counts[threadIdx.x] = c;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half >>= 1) {
    if (threadIdx.x < half) {
      sums[threadIdx.x] += sums[threadIdx.x + half];
      counts[threadIdx.x] += counts[threadIdx.x + half];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *loss = sums[0] / counts[0];  // 0 / 0 = NaN when every row is ignored, as LibTorch
    *count = counts[0];
  }
}

template <class T>
__global__ void cross_entropy_grad_kernel(CrossEntropyRows<T> t, const float* grad_loss, const float* count, T* grad,
                                          int64_t N, int64_t V) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= N) return;
  const int64_t target = t.targets[row];
  const T* x = t.logits + row * V;
  T* out = grad + row * V;
  if (target == kCrossEntropyIgnore) {
    for (int64_t v = lane; v < V; v += 32) out[v] = static_cast<T>(0.0f);
    return;
  }
  const float lse = t.lse[row], scale = *grad_loss / *count;
  for (int64_t v = lane; v < V; v += 32)
    out[v] = static_cast<T>(cross_entropy_grad(static_cast<float>(x[v]), lse, v == target, scale));
}

unsigned row_blocks(int64_t N) { return static_cast<unsigned>((N + kWarps - 1) / kWarps); }

}  // namespace

template <class T>
void launch_cross_entropy_forward(const CrossEntropyRows<T>& t, float* loss, float* count, int64_t N, int64_t V,
                                  cudaStream_t stream) {
  if (N > 0) {
    cross_entropy_rows_kernel<T><<<row_blocks(N), 32 * kWarps, 0, stream>>>(t, N, V);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  cross_entropy_mean_kernel<<<1, kReduceThreads, 0, stream>>>(t.row_loss, t.targets, loss, count, N);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <class T>
void launch_cross_entropy_backward(const CrossEntropyRows<T>& t, const float* grad_loss, const float* count, T* grad,
                                   int64_t N, int64_t V, cudaStream_t stream) {
  if (N == 0) return;
  cross_entropy_grad_kernel<T><<<row_blocks(N), 32 * kWarps, 0, stream>>>(t, grad_loss, count, grad, N, V);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

#define NANOGPT_CROSS_ENTROPY(T)                                                                                 \
  template void launch_cross_entropy_forward<T>(const CrossEntropyRows<T>&, float*, float*, int64_t, int64_t,  \
                                                cudaStream_t);                                                 \
  template void launch_cross_entropy_backward<T>(const CrossEntropyRows<T>&, const float*, const float*, T*,   \
                                                 int64_t, int64_t, cudaStream_t);
NANOGPT_CROSS_ENTROPY(float)
NANOGPT_CROSS_ENTROPY(c10::BFloat16)
NANOGPT_CROSS_ENTROPY(c10::Half)
#undef NANOGPT_CROSS_ENTROPY

}  // namespace nanogpt::model::cuda
