// Version-specific LibTorch calls (see backend.h).
#include "model/backend.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <algorithm>
#include <stdexcept>
#include <thread>

#if TORCH_VERSION_MAJOR >= 2
#define NANOGPT_HAS_SDPA 1
#else
#define NANOGPT_HAS_SDPA 0
#endif

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define NANOGPT_AUTOCAST_BY_DEVICE 1  // set_autocast_enabled(device_type, bool)
#else
#define NANOGPT_AUTOCAST_BY_DEVICE 0  // set_cpu_enabled / set_enabled
#endif

namespace nanogpt::model::backend {

std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

bool has_sdpa() { return NANOGPT_HAS_SDPA != 0; }

torch::Tensor sdpa(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                   const torch::Tensor& causal_mask, bool is_causal, double dropout_p) {
#if NANOGPT_HAS_SDPA
  c10::optional<at::Tensor> mask;
  if (causal_mask.defined()) mask = causal_mask.logical_not();  // SDPA's bool mask: true = attend
  return at::scaled_dot_product_attention(q, k, v, mask, dropout_p, is_causal);
#else
  (void)q, (void)k, (void)v, (void)causal_mask, (void)is_causal, (void)dropout_p;
  throw std::runtime_error("[model] SDPA needs LibTorch >= 2.0; this build has " + torch_version());
#endif
}

namespace {
bool autocast_enabled(bool cuda) {
#if NANOGPT_AUTOCAST_BY_DEVICE
  return at::autocast::is_autocast_enabled(cuda ? at::kCUDA : at::kCPU);
#else
  return cuda ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled();
#endif
}
torch::ScalarType autocast_dtype(bool cuda) {
#if NANOGPT_AUTOCAST_BY_DEVICE
  return at::autocast::get_autocast_dtype(cuda ? at::kCUDA : at::kCPU);
#else
  return cuda ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
#endif
}
void set_autocast(bool cuda, bool enabled, torch::ScalarType dtype) {
#if NANOGPT_AUTOCAST_BY_DEVICE
  at::autocast::set_autocast_enabled(cuda ? at::kCUDA : at::kCPU, enabled);
  at::autocast::set_autocast_dtype(cuda ? at::kCUDA : at::kCPU, dtype);
#else
  if (cuda) {
    at::autocast::set_enabled(enabled);
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_cpu_enabled(enabled);
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}
}  // namespace

AutocastGuard::AutocastGuard(torch::Device device, torch::ScalarType dtype, bool enabled)
    : enabled_(enabled), cuda_(device.is_cuda()) {
  if (!enabled_) return;
  previous_enabled_ = autocast_enabled(cuda_);
  previous_dtype_ = autocast_dtype(cuda_);
  set_autocast(cuda_, true, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!enabled_) return;
  // Leaving the outermost region frees the cached low-precision copies of the weights.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  set_autocast(cuda_, previous_enabled_, previous_dtype_);
}

torch::Device resolve_device(const std::string& name) {
  if (name == "auto") return torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  if (name == "cpu") return torch::kCPU;
  if (name.rfind("cuda", 0) == 0) {
    if (!torch::cuda::is_available())
      throw std::runtime_error("[device] '" + name + "' requested but CUDA is not available (LibTorch " +
                               torch_version() + ", " + std::to_string(torch::cuda::device_count()) +
                               " GPUs): use --device=cpu or --device=auto");
    torch::Device device(name);  // parses "cuda:N"
    if (device.has_index() && device.index() >= static_cast<int64_t>(torch::cuda::device_count()))
      throw std::runtime_error("[device] '" + name + "': only " + std::to_string(torch::cuda::device_count()) +
                               " CUDA device(s)");
    return device;
  }
  throw std::runtime_error("[device] unknown device '" + name + "' (use auto, cpu, cuda or cuda:N)");
}

int64_t set_threads(int64_t n) {
  if (n <= 0) n = std::max<int64_t>(1, std::thread::hardware_concurrency());
  torch::set_num_threads(static_cast<int>(n));
  return n;
}

void synchronize(torch::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index() < 0 ? -1 : device.index());
}

}  // namespace nanogpt::model::backend
