// GEMM timing (see peak_flops.h).
#include "runtime/peak_flops.h"

#include <algorithm>
#include <chrono>

#include "runtime/device.h"

namespace nanogpt::runtime {

double measure_gemm_flops(torch::Device device, torch::ScalarType dtype, int64_t m, int64_t k, int64_t n, int repeats) {
  c10::InferenceMode guard;
  auto opts = torch::TensorOptions().device(device).dtype(dtype);
  // Values do not matter for timing; filling them without the global generator keeps a resumed
  // training run's random stream untouched.
  auto a = torch::full({m, k}, 0.5, opts), b = torch::full({k, n}, 0.25, opts);
  auto c = torch::empty({m, n}, opts);
  torch::mm_out(c, a, b);  // warm-up: first call allocates and picks kernels
  runtime::synchronize(device);
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    torch::mm_out(c, a, b);
    runtime::synchronize(device);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n) / best;
}

double datasheet_bf16_flops(const std::string& gpu_name) {
  // Most specific names first: "H100 PCIe" before "H100". TFLOP/s, dense bf16 with fp32 accumulation.
  static const std::pair<const char*, double> kPeaks[] = {
      {"GH200", 989.4}, {"H200 NVL", 835.5}, {"H200", 989.4}, {"H100 NVL", 835.5}, {"H100 PCIe", 756.0},
      {"H100", 989.4},  {"H800", 989.4},     {"B200", 2250.0}, {"A100", 312.0},    {"A800", 312.0},
      {"L40S", 362.1},  {"L40", 181.0},      {"L4", 121.0},
  };
  for (const auto& [name, tflops] : kPeaks)
    if (gpu_name.find(name) != std::string::npos) return tflops * 1e12;
  return 0.0;
}

double measure_peak_flops(torch::Device device, torch::ScalarType dtype) {
  const int64_t size = device.is_cuda() ? 4096 : 1024;
  return measure_gemm_flops(device, dtype, size, size, size, device.is_cuda() ? 10 : 4);
}

}  // namespace nanogpt::runtime
