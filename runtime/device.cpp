// Device- and runtime-specific LibTorch calls (see device.h).
#include "runtime/device.h"

#include <fmt/format.h>

#include <ATen/autocast_mode.h>
#include <ATen/cpu/Utils.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <dlfcn.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "runtime/cuda_plugin.h"
#include "runtime/peak_flops.h"

namespace nanogpt::runtime {

std::string torch_version() { return TORCH_VERSION; }

bool cuda_compiled() { return NANOGPT_TORCH_CUDA != 0; }  // set by CMake from the LibTorch it found

AutocastGuard::AutocastGuard(torch::Device device, torch::ScalarType dtype, bool enabled)
    : enabled_(enabled), device_type_(device.type()) {
  if (!enabled_) return;
  previous_enabled_ = at::autocast::is_autocast_enabled(device_type_);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_type_);
  at::autocast::set_autocast_enabled(device_type_, true);
  at::autocast::set_autocast_dtype(device_type_, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!enabled_) return;
  // Leaving the outermost region frees the cached low-precision copies of the weights.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
}

namespace {

std::mutex g_cuda_mutex;
const CudaPlugin* g_cuda_plugin = nullptr;

bool cuda_backend_registered() { return c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA); }

// An NVIDIA driver on this machine (its control device, or its /proc entry): "auto" may find a GPU.
bool nvidia_driver_present() {
  std::error_code ec;
  return std::filesystem::exists("/dev/nvidiactl", ec) || std::filesystem::exists("/proc/driver/nvidia/version", ec);
}

}  // namespace

std::string cuda_plugin_path() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::filesystem::path dir = ec ? std::filesystem::path(".") : exe.parent_path();
  const std::filesystem::path beside = dir / "libnanogpt_cuda.so", installed = dir / ".." / "lib" / "libnanogpt_cuda.so";
  if (!std::filesystem::exists(beside, ec) && std::filesystem::exists(installed, ec))
    return installed.lexically_normal().string();
  return beside.string();
}

bool load_cuda(const std::string& device_name) {
  const bool asked = device_name.rfind("cuda", 0) == 0;
  if (!asked && !(device_name == "auto" && nvidia_driver_present())) return cuda_backend_registered();
  std::lock_guard<std::mutex> lock(g_cuda_mutex);
  if (g_cuda_plugin || !cuda_compiled()) return cuda_backend_registered();
  const std::string path = cuda_plugin_path();
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!handle) {
    if (asked)
      throw std::runtime_error(fmt::format("[device] cannot load CUDA support '{}': {} (rebuild with scripts/build.sh, "
                                           "or use --device=cpu)",
                                           path, ::dlerror()));
    return cuda_backend_registered();
  }
  using Entry = const CudaPlugin* (*)();
  auto entry = reinterpret_cast<Entry>(::dlsym(handle, "nanogpt_cuda_plugin"));
  if (!entry) throw std::runtime_error(fmt::format("[device] '{}' is not nanogpt's CUDA plugin (rebuild)", path));
  g_cuda_plugin = entry();
  return cuda_backend_registered();
}

const CudaPlugin* cuda_plugin() {
  std::lock_guard<std::mutex> lock(g_cuda_mutex);
  return g_cuda_plugin;
}

bool has_fast_bf16(torch::Device device) {
  if (device.is_cuda()) {
    const CudaPlugin* plugin = cuda_plugin();
    return plugin && plugin->compute_capability_major(device.has_index() ? device.index() : 0) >= 8;
  }
  // cpuinfo's flags as LibTorch reports them.
  for (const auto& [name, value] : at::cpu::get_cpu_capabilities())
    if ((name == "avx512_bf16" || name == "amx_bf16") && value.isBool() && value.toBool()) return true;
  return false;
}

std::string resolve_dtype(const std::string& dtype, torch::Device device) {
  if (dtype != "auto") return dtype;
  if (has_fast_bf16(device)) return "bfloat16";
  return device.is_cuda() ? "float16" : "float32";
}

std::string resolve_sampling_dtype(const std::string& dtype, torch::Device device) {
  if (dtype == "auto" && device.is_cuda()) return "float32";
  return resolve_dtype(dtype, device);
}

std::string resolve_training_dtype(const std::string& dtype, torch::Device device) {
  const std::string resolved = resolve_dtype(dtype, device);
  if (dtype != "auto" || resolved != "bfloat16" || !device.is_cpu()) return resolved;
  static const bool bf16_faster = [] {
    // Alternating rounds, the best of each dtype: the first products after start-up ran fp32 at
    // 160-310 GFLOP/s from one process to the next (bf16 92-167), and 3 of 10 processes timing
    // fp32 first and then bf16 picked bf16.
    double fp32 = 0.0, bf16 = 0.0;
    for (int round = 0; round < 4; ++round) {
      fp32 = std::max(fp32, measure_gemm_flops(torch::kCPU, torch::kFloat, 512, 384, 512, 2));
      bf16 = std::max(bf16, measure_gemm_flops(torch::kCPU, torch::kBFloat16, 512, 384, 512, 2));
    }
    return bf16 > fp32;
  }();
  return bf16_faster ? resolved : "float32";
}

torch::ScalarType autocast_dtype(const std::string& dtype) {
  if (dtype == "bfloat16") return torch::kBFloat16;
  if (dtype == "float16") return torch::kHalf;
  return torch::kFloat;
}

torch::Device resolve_device(const std::string& name) {
  load_cuda(name);  // before LibTorch is first asked about CUDA
  if (name == "auto") return torch::cuda::is_available() ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  if (name == "cpu") return torch::kCPU;
  if (name.rfind("cuda", 0) == 0) {
    if (!torch::cuda::is_available())
      throw std::runtime_error("[device] '" + name + "' requested but no CUDA GPU is available (LibTorch " +
                               torch_version() + (cuda_compiled() ? ", built with CUDA" : ", built without CUDA") +
                               "): use --device=cpu or --device=auto");
    torch::Device device(name);  // parses "cuda:N"
    if (device.has_index() && device.index() >= static_cast<int64_t>(torch::cuda::device_count()))
      throw std::runtime_error(fmt::format("[device] '{}': only {} CUDA device(s)", name, torch::cuda::device_count()));
    return device;
  }
  throw std::runtime_error("[device] unknown device '" + name + "' (use auto, cpu, cuda or cuda:N)");
}

torch::Device process_device(torch::Device resolved, int64_t local_rank) {
  if (!resolved.is_cuda() || resolved.has_index()) return resolved;
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

void set_current_device(torch::Device device) {
  if (!device.is_cuda()) return;
  if (!device.has_index())
    throw std::runtime_error("[device] '" + device.str() + "' has no index: pass it through process_device first");
  c10::impl::VirtualGuardImpl(device.type()).setDevice(device);
}

void set_tf32(bool enabled) {
  const auto precision = enabled ? at::Float32Precision::TF32 : at::Float32Precision::IEEE;
  at::globalContext().setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::MATMUL, precision);
  at::globalContext().setFloat32Precision(at::Float32Backend::CUDA, at::Float32Op::CONV, precision);
}

std::pair<torch::Tensor, torch::Tensor> to_device(const torch::Tensor& x, const torch::Tensor& y, torch::Device device) {
  if (device.is_cpu()) return {x, y};
  if (!device.is_cuda()) return {x.to(device), y.to(device)};
  // One pinned buffer, one asynchronous copy. The pinned block goes back to LibTorch's caching host
  // allocator when `staged` dies here, and is handed out again only once the copy has completed
  // (the copy records an event on it).
  auto staged = torch::empty({2, x.size(0), x.size(1)}, x.options().pinned_memory(true));  // (2, B, T)
  staged[0].copy_(x);
  staged[1].copy_(y);
  auto on_device = staged.to(device, /*non_blocking=*/true);  // (2, B, T)
  return {on_device[0], on_device[1]};
}

std::string device_name(torch::Device device) {
  const CudaPlugin* plugin = device.is_cuda() ? cuda_plugin() : nullptr;
  return plugin ? plugin->device_name(device.has_index() ? device.index() : 0) : "";
}

GpuMemory peak_gpu_memory(torch::Device device) {
  GpuMemory m;
  const CudaPlugin* plugin = device.is_cuda() ? cuda_plugin() : nullptr;
  if (plugin) plugin->peak_memory(device.has_index() ? device.index() : 0, &m.peak_allocated, &m.peak_reserved);
  return m;
}

void reset_peak_gpu_memory(torch::Device device) {
  const CudaPlugin* plugin = device.is_cuda() ? cuda_plugin() : nullptr;
  if (plugin) plugin->reset_peak_memory(device.has_index() ? device.index() : 0);
}

int64_t set_threads(int64_t n) {
  if (n <= 0) n = std::max<int64_t>(1, std::thread::hardware_concurrency());
  // Only a change: LibTorch's set_num_threads also starts a thread pool for QNNPACK/XNNPACK, which we
  // never use, and its new worker spins on a core for tens of milliseconds, while a `sample` of the
  // CPU-preset model computes its first token on both (1-token samples, 30 runs alternating with the
  // program before: median time to the first token 0.214 -> 0.189 s).
  if (torch::get_num_threads() != n) torch::set_num_threads(static_cast<int>(n));
  return n;
}

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e)) return true;
  const std::string what = e.what();
  return what.find("DefaultCPUAllocator: can't allocate memory") != std::string::npos ||
         what.find("DefaultCPUAllocator: not enough memory") != std::string::npos;
}

void synchronize(torch::Device device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index() < 0 ? -1 : device.index());
}

}  // namespace nanogpt::runtime
