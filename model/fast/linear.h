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

/// Whether mm_to_float's bf16 products are summed in fp32 and never rounded to bf16, through MKL's
/// bf16 GEMM: on Intel CPUs (its AMX / AVX512-BF16 kernels; faster than at::mm's oneDNN call on the
/// presets' small products, docs/perf-log.md). On other CPUs MKL's bf16 GEMM runs a slow generic path
/// (an AMD Zen 4 with AVX512-BF16: 2.5-3x oneDNN's time at the Tang model's head), so there they go
/// through at::mm's bf16 GEMM (oneDNN), summed in fp32 and rounded to bf16 once, as autocast's own
/// linear rounds them. NANOGPT_BF16_GEMM=mkl or =onednn picks one on any CPU (the tests run both);
/// a LibTorch without MKL (Arm) widens to fp32 instead (true: the same sums).
bool bf16_products_summed_in_fp32();

/// a (M, K) · b (K, N) returned in fp32, each operand row-major or the transpose of a row-major
/// matrix (else copied). Both bf16 on the CPU: as bf16_products_summed_in_fp32() says (MKL's bf16
/// GEMM, or oneDNN's rounded once); without MKL widened and multiplied in fp32 (the same sums: bf16
/// values are exact in fp32). Not differentiable.
torch::Tensor mm_to_float(const torch::Tensor& a, const torch::Tensor& b);

/// a · b as `dtype`: fp32 on the CPU through mm_to_float (summed in fp32, never rounded to the
/// operands' bf16 on the way); otherwise a.mm(b) in the operands' dtype, then converted. For the
/// gradients that land in a parameter's or an input's dtype. Not differentiable.
torch::Tensor mm_into(const torch::Tensor& a, const torch::Tensor& b, c10::ScalarType dtype);

/// x (..., in), w (out, in), b (out) or undefined -> (..., out). Differentiable.
torch::Tensor dense(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b = {},
                    Result result = Result::kAutocast);

}  // namespace nanogpt::model
