// The machine's matmul peak, measured: the denominator of MFU. nanoGPT states an A100's 312
// TFLOP/s; a CPU has no such datasheet number we can trust, so we time LibTorch's own GEMM.
#pragma once

#include <torch/torch.h>

#include <string>

namespace nanogpt::runtime {

/// Best-of-`repeats` throughput (FLOP/s) of an (m x k) @ (k x n) matmul in `dtype` on `device`
/// (bfloat16 on CPU runs through oneDNN, on AMX where present).
double measure_gemm_flops(torch::Device device, torch::ScalarType dtype, int64_t m, int64_t k, int64_t n, int repeats = 5);

/// A GPU's dense (no sparsity) bf16 tensor-core peak from its datasheet, by the name CUDA reports
/// ("NVIDIA H200", "NVIDIA A100-SXM4-80GB"): the denominator of MFU on a GPU, as nanoGPT takes an
/// A100's 312 TFLOP/s. 0 for a GPU not in the table (then the measured GEMM peak stands in).
double datasheet_bf16_flops(const std::string& gpu_name);

/// A quick (< 0.5 s) estimate of the peak for MFU: a large square GEMM (1024 on CPU, 4096 on CUDA).
double measure_peak_flops(torch::Device device, torch::ScalarType dtype);

}  // namespace nanogpt::runtime
