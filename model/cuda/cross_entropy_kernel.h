// Cross-entropy on a GPU that never makes an fp32 copy of the logits: the CUDA plugin's
// cross_entropy entry (runtime/cuda_plugin.h), which the model's loss (model/gpt.cpp) calls for
// logits on a GPU. The kernels are in cross_entropy_kernel.cu, their arithmetic in
// cross_entropy_kernel_math.h.
#pragma once

#include <ATen/core/Tensor.h>

namespace nanogpt::model::cuda {

/// logits (N, V) fp32, bf16 or fp16, targets (N,) int64 in [0, V) or -100 (ignored) on the logits'
/// device -> the mean over the rows not ignored of -log softmax(logits)[target], an fp32 scalar (NaN
/// when every row is ignored, and for a target outside [0, V): checking would read the device), as
/// LibTorch's cross_entropy on the logits in fp32. Differentiable w.r.t. logits: the gradient is
/// written in the logits' dtype, in one pass that reads them again (nothing but the rows' log-sum-exp
/// is kept). Two launches forward, one backward. An undefined tensor for inputs it does not take
/// (another dtype or layout), so that the caller keeps its own path. On CPU tensors the same
/// arithmetic runs as a loop on the host: how the tests check it on a machine without a GPU.
at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& targets);

}  // namespace nanogpt::model::cuda
