// dense(): y = x Wᵀ + b, with a fast path for one row. Decoding one token multiplies a single row by every
// weight matrix; LibTorch 1.13 hands a 1-row matmul to GEMM, which packs the whole weight first,
// while a matrix-vector product reads it once (measured 4-9x faster per layer here).
#pragma once

#include <torch/torch.h>

namespace nanogpt::model {

/// What dtype dense() returns under CPU autocast. kAutocast: autocast's (bf16 / fp16), as its linear
/// would. kWide: the product summed in fp32 and left in fp32 (the bias added in fp32), for a
/// projection that joins the fp32 residual stream: no rounding to bf16 that the sum then undoes,
/// and no mixed-dtype add. Outside CPU autocast both are the same.
enum class Result { kAutocast, kWide };

/// a (M, K) · b (K, N) returned in fp32, each operand row-major or the transpose of a row-major
/// matrix (else copied). Both bf16 on the CPU: summed in fp32 and never rounded to bf16, through MKL's
/// bf16 GEMM where LibTorch carries it (its AMX / AVX512-BF16 kernels; faster than at::mm's oneDNN
/// call on the presets' small products, docs/perf-log.md); otherwise widened and multiplied in fp32 (the
/// same sums: bf16 values are exact in fp32). Not differentiable.
torch::Tensor mm_to_float(const torch::Tensor& a, const torch::Tensor& b);

/// a · b as `dtype`: fp32 on the CPU through mm_to_float (summed in fp32, never rounded to the
/// operands' bf16 on the way); otherwise a.mm(b) in the operands' dtype, then converted. For the
/// gradients that land in a parameter's or an input's dtype. Not differentiable.
torch::Tensor mm_into(const torch::Tensor& a, const torch::Tensor& b, c10::ScalarType dtype);

/// x (..., in), w (out, in), b (out) or undefined -> (..., out). Differentiable.
torch::Tensor dense(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b = {},
                    Result result = Result::kAutocast);

}  // namespace nanogpt::model
