// The one place that knows which LibTorch it is built against. SDPA (LibTorch >= 2.0), autocast
// (whose C++ API changed in 2.4) and CUDA queries sit here behind compile-time guards, so the rest
// of the code builds unchanged on Debian's LibTorch 1.13 (CPU) and on LibTorch 2.x (CUDA).
#pragma once

#include <torch/torch.h>

#include <string>

namespace nanogpt::model::backend {

/// "1.13.0", "2.5.1", ...
std::string torch_version();

/// True when at::scaled_dot_product_attention exists (LibTorch >= 2.0).
bool has_sdpa();

/// softmax(q kᵀ / √hs + mask) v through LibTorch's fused kernel. q (B, nh, Tq, hs), k and v
/// (B, nh, Tk, hs); causal_mask is either undefined (no mask, every key visible), or bool (Tq, Tk)
/// with true = masked out. `is_causal` uses the kernel's own mask (only when Tq == Tk).
/// Throws on LibTorch < 2.0.
torch::Tensor sdpa(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                   const torch::Tensor& causal_mask, bool is_causal, double dropout_p);

/// Turns autocast on for `device` with `dtype` (e.g. bfloat16) for the guard's lifetime; a no-op
/// when `enabled` is false. Nesting-safe: restores the previous state.
class AutocastGuard {
 public:
  AutocastGuard(torch::Device device, torch::ScalarType dtype, bool enabled);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool enabled_;
  bool cuda_;
  bool previous_enabled_ = false;
  torch::ScalarType previous_dtype_ = torch::kFloat;
};

/// Resolves "auto" | "cpu" | "cuda" | "cuda:N" to a device. Throws "[device] ..." when CUDA is asked
/// for and not available (names the LibTorch build and a hint).
torch::Device resolve_device(const std::string& name);

/// Sets LibTorch's intra-op threads: n > 0 as given, 0 = every core (Debian's LibTorch defaults to 1).
/// Returns the number set.
int64_t set_threads(int64_t n);

/// Waits for queued kernels on `device` (for honest timings on CUDA); no-op on CPU.
void synchronize(torch::Device device);

}  // namespace nanogpt::model::backend
