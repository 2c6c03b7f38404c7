// RoPE's rotation in one CUDA kernel each way: the CUDA plugin's rope_rotate_split entry
// (runtime/cuda_plugin.h), which model::Rope calls for a tensor on a GPU. The kernel is in
// rope_kernel.cu, its arithmetic and the backward's derivation in rope_kernel_math.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

namespace nanogpt::model::cuda {

/// As model::rope_rotate_split (model/fast/rope.h) for a CUDA x: x (B, T, H, hs) fp32, bf16 or fp16
/// with any (B, T, H) strides (x may be a slice of the QKV product; rows of hs values that are not
/// packed are copied packed once); cos2, sin2 Rope's fp32 tables (P, 1, hs), contiguous, on x's
/// device, P >= start + T. Rotates positions start .. start + T - 1 and returns heads [0, n_first)
/// as (B, n_first, T, hs) and the rest as (B, H - n_first, T, hs), contiguous, in x's dtype (fp32
/// arithmetic): the queries and keys as attention multiplies them. Differentiable w.r.t. x; one
/// launch forward, one backward. Undefined tensors for an x it does not take (another dtype, an odd
/// hs), so that the caller keeps its own path. On CPU tensors the same arithmetic runs as a loop on
/// the host: how the tests check it on a machine without a GPU.
std::pair<at::Tensor, at::Tensor> rope_rotate_split(const at::Tensor& x, const at::Tensor& cos2, const at::Tensor& sin2,
                                                    int64_t start, int64_t n_first);

}  // namespace nanogpt::model::cuda
