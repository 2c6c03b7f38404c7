// A block's residual add + dropout + LayerNorm / RMSNorm in one CUDA kernel each way: the CUDA
// plugin's residual_dropout_norm entry (runtime/cuda_plugin.h), which model::residual_add_norm
// (model/norm.h) calls for tensors on a GPU. The kernels are in residual_norm_kernel.cu, their
// arithmetic, the dropout's mask and the backward's derivation in residual_norm_kernel_math.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

namespace nanogpt::model::cuda {

/// h = x + dropout_p(y) and, when `weight` is defined, n = LayerNorm(h) (RMSNorm when `rms`) with
/// `weight`, `bias` (or none) and `eps`; returns {h, n} (n undefined without a norm), both fp32 like
/// x. x (..., C) fp32; y x's shape in fp32, bf16 or fp16; C a multiple of 4, at most 1,024; weight and
/// bias fp32 (C,) on x's device. Differentiable w.r.t. x, y, weight and bias; one launch forward, one
/// backward (and a sum of per-block dw, db). p > 0 drops elements of y: the mask is drawn from
/// `rng` = {seed, offset} (an int64 CPU tensor of 2) when defined, else from the CUDA device's default
/// generator (graph-safe, 4 of its philox offsets a call); drawn again in backward, never stored.
/// Undefined tensors for inputs it does not take (another dtype, C), so that the caller keeps its own
/// path. On CPU tensors the same arithmetic runs as a loop on the host (`rng` required for p > 0):
/// how the tests check it on a machine without a GPU.
std::pair<at::Tensor, at::Tensor> residual_dropout_norm(const at::Tensor& x, const at::Tensor& y, double p,
                                                        const at::Tensor& rng, const at::Tensor& weight,
                                                        const at::Tensor& bias, double eps, bool rms);

}  // namespace nanogpt::model::cuda
