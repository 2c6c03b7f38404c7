// The causal softmax of attention's training step on the CPU, forward and backward, each one pass
// over the scores. The math path (model/attention.cpp) spells it out as LibTorch ops: scale and mask
// (baddbmm with a 0 / -inf bias), softmax widened to fp32, the weights rounded back to the values'
// dtype, and the same in reverse for backward: at the CPU preset (T = 64) those casts and passes cost
// more than the two batched products around them. Here each row is read once in its own dtype, the
// exponentials are summed in fp32, and the weights are written once in the scores' dtype; the masked
// keys (j > i) are never exponentiated and come out exactly 0.
#pragma once

#include <torch/torch.h>

namespace nanogpt::model {

/// scores (g, T, T) -> weights (g, T, T) in the same dtype: row i is softmax(scale * scores[i, 0..i])
/// followed by zeros for keys j > i (query i sees keys 0..i). fp32 and bf16 on the CPU in one pass;
/// other devices (CUDA) and dtypes (fp16, fp64) as the same LibTorch ops the math path runs.
torch::Tensor causal_softmax(const torch::Tensor& scores, double scale);

/// The gradient of causal_softmax's input from its output `weights` and the gradient `d_weights`
/// (both (g, T, T), one dtype): d_scores[i, j] = scale * w[i, j] (d_w[i, j] - sum_k w[i, k] d_w[i, k]),
/// summed in fp32, 0 for j > i.
torch::Tensor causal_softmax_backward(const torch::Tensor& d_weights, const torch::Tensor& weights, double scale);

}  // namespace nanogpt::model
