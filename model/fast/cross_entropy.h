// Cross-entropy over a large vocabulary in one pass per row, on the CPU. The plain path (logits cast
// to fp32, log_softmax, nll_loss; then in backward nll's, log_softmax's and the cast's gradients) reads
// and writes the (N, V) logits about seven times; at the Tang poems preset (V = 7,443, N = 1,024) those
// passes cost as much as the head's GEMM. Here each row's max, log-sum-exp, loss and gradient
// (softmax - one_hot) / n come out of one visit while the row is in cache, the gradient written in the
// logits' dtype (bf16 under autocast), and backward only scales it by the incoming gradient.
// Other devices, and inputs this kernel does not take, go to LibTorch's cross_entropy.
#pragma once

#include <torch/torch.h>

namespace nanogpt::model {

/// logits (N, V) fp32 / bf16 / fp16, targets (N,) int64 in [0, V) or -100 (ignored, as LibTorch's
/// default ignore_index) -> the mean over the non-ignored rows of -log softmax(logits)[target], an
/// fp32 scalar (NaN when every row is ignored, as LibTorch). Differentiable w.r.t. logits. Throws
/// "[model] ..." on wrong shapes or a target out of range.
torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets);

/// cross_entropy of the soft-capped logits z = softcap tanh(logits / softcap) (softcap > 0), the cap
/// folded into the same pass: the gradient w.r.t. the raw logits is cross_entropy's times
/// 1 - (z / softcap)^2, and z never goes through tanh's own forward and backward passes over (N, V)
/// (at the Tang poems model they cost ~15 % of a step). Returns {the loss, z (N, V) in the logits'
/// dtype}; z carries no gradient of its own. Where the fused kernel does not apply: LibTorch's tanh,
/// then cross_entropy (z differentiable).
std::pair<torch::Tensor, torch::Tensor> softcapped_cross_entropy(const torch::Tensor& logits,
                                                                 const torch::Tensor& targets, double softcap);

/// The loss of the head's logits x wᵀ (soft-capped when softcap > 0, as softcapped_cross_entropy),
/// never holding all of them: the rows go in chunks of ~2M logits; each chunk's logits are computed,
/// turned in place into their gradient by the pass above while they are in cache, and the gradients
/// w.r.t. x and w accumulated at once (dx = g w, dw += gᵀ x). The (N, V) logits, their capped copy and
/// their gradient are never stored, nor read back by backward, which only scales the kept dx and dw
/// (at the Tang poems speedrun's batch, 4,096 rows of 7,443: three 122 MB tensors). x (N, C) and
/// w (V, C) fp32 on the CPU (head_cross_entropy_applies), targets as cross_entropy's. Differentiable
/// w.r.t. x and w; the mean loss as an fp32 scalar.
torch::Tensor head_cross_entropy(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& targets,
                                 double softcap);
bool head_cross_entropy_applies(const torch::Tensor& x, const torch::Tensor& w);

/// Whether cross_entropy takes the fused CPU kernel for these logits (else LibTorch's cross_entropy).
bool fused_cross_entropy_applies(const torch::Tensor& logits);

}  // namespace nanogpt::model
