// RoPE's rotation on a GPU, one kernel each way (rope_kernel_math.h has the arithmetic and the
// backward's derivation; rope_kernel.cpp the autograd wrapper). One block per (b, t): its threads
// walk the H * h pairs of that position's heads, i fastest, so that neighbouring threads read and
// write neighbouring elements of a row. The position's two table rows are read once per pair from
// L1/L2 (every block of the same t reads the same rows).
#include "model/cuda/rope_kernel_math.h"

#include <c10/cuda/CUDAException.h>

#include <algorithm>

namespace nanogpt::model::cuda {
namespace {

template <class T>
__global__ void rope_rotate_kernel(bool backward, SplitHeads<const T> in, SplitHeads<T> out, const float* cos2,
                                   const float* sin2, int64_t start, int64_t Tn, int pairs, int h) {
  const int64_t b = blockIdx.x / Tn, t = blockIdx.x % Tn;
  const float* cos2_row = cos2 + (start + t) * 2 * h;
  const float* sin2_row = sin2 + (start + t) * 2 * h;
  for (int j = threadIdx.x; j < pairs; j += blockDim.x) {
    const int head = j / h, i = j - head * h;
    rope_rotate_pair(backward, in.row(b, t, head), out.row(b, t, head), cos2_row, sin2_row, i, h);
  }
}

}  // namespace

template <class T>
void launch_rope_rotate(bool backward, const SplitHeads<const T>& in, const SplitHeads<T>& out, const float* cos2,
                        const float* sin2, int64_t start, int64_t B, int64_t Tn, int64_t H, int64_t hs,
                        cudaStream_t stream) {
  const int64_t pairs = H * (hs / 2);
  if (B * Tn == 0 || pairs == 0) return;
  // Whole warps, at most 256 threads: a small model's few pairs per position need only one warp.
  const int threads = static_cast<int>(std::min<int64_t>(256, (pairs + 31) / 32 * 32));
  rope_rotate_kernel<T><<<static_cast<unsigned>(B * Tn), threads, 0, stream>>>(
      backward, in, out, cos2, sin2, start, Tn, static_cast<int>(pairs), static_cast<int>(hs / 2));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template void launch_rope_rotate<float>(bool, const SplitHeads<const float>&, const SplitHeads<float>&, const float*,
                                        const float*, int64_t, int64_t, int64_t, int64_t, int64_t, cudaStream_t);
template void launch_rope_rotate<c10::BFloat16>(bool, const SplitHeads<const c10::BFloat16>&,
                                                const SplitHeads<c10::BFloat16>&, const float*, const float*, int64_t,
                                                int64_t, int64_t, int64_t, int64_t, cudaStream_t);
template void launch_rope_rotate<c10::Half>(bool, const SplitHeads<const c10::Half>&, const SplitHeads<c10::Half>&,
                                            const float*, const float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                            cudaStream_t);

}  // namespace nanogpt::model::cuda
