// LibTorch's CUDA half, loaded only when a run will use a GPU. Linking libtorch_cuda.so into the
// program would map it (with cuBLAS, cuDNN, NCCL...) into every process: 0.15-0.25 s of start-up
// and ~360 MB of resident memory for a `sample` on the CPU. Instead the program links LibTorch's CPU
// half, and the few things that need CUDA's own headers live in a plugin (runtime/cuda/plugin.cpp,
// libnanogpt_cuda.so beside the program) that brings libtorch_cuda.so with it when it is opened.
// Once it is loaded, LibTorch's CUDA backend registers itself and torch::cuda::* work as usual.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <string>

namespace nanogpt::runtime {

/// What the plugin offers; its functions are C++ (same compiler, same LibTorch).
struct CudaPlugin {
  int (*compute_capability_major)(int device);  // e.g. 8 for an A100
  std::string (*device_name)(int device);       // e.g. "NVIDIA H200"
  // The caching allocator's high-water marks since the last reset: bytes held by tensors, and
  // bytes reserved from the driver (what nvidia-smi shows, less the context).
  void (*peak_memory)(int device, int64_t* allocated, int64_t* reserved);
  void (*reset_peak_memory)(int device);
  c10::intrusive_ptr<c10d::Backend> (*make_nccl_backend)(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                         int size, std::chrono::milliseconds timeout);
};

/// Loads the plugin (and so libtorch_cuda.so) when `device_name` may use a GPU: "cuda", "cuda:N",
/// or "auto" on a machine with an NVIDIA driver. It must run before anything asks LibTorch about
/// CUDA (LibTorch keeps its first answer): runtime::resolve_device calls it first thing.
/// Returns whether CUDA is loaded now (always true in a program that links libtorch_cuda.so itself,
/// such as the tests). Throws "[device] ..." when a GPU is asked for and the plugin cannot be loaded.
bool load_cuda(const std::string& device_name);

/// The plugin's functions; null until load_cuda loaded it (or in a CPU-only build).
const CudaPlugin* cuda_plugin();

}  // namespace nanogpt::runtime

extern "C" const nanogpt::runtime::CudaPlugin* nanogpt_cuda_plugin();  // the plugin's one export
