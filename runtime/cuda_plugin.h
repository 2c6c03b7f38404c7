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
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace nanogpt::model {
class StepGraphs;  // model/static_decoder.h
}  // namespace nanogpt::model

namespace nanogpt::runtime {

/// A piece of work captured once as a CUDA graph, replayed on the current stream.
class CapturedGraph {
 public:
  virtual ~CapturedGraph() = default;
  virtual void replay() = 0;
};

/// What the GPU did while a piece of work ran, from LibTorch's Kineto profiler.
struct GpuProfile {
  struct Kernel {
    std::string name;
    int64_t calls = 0;
    double total_ms = 0;
  };
  double wall_ms = 0;      // host time from the first launch to the end of the last kernel
  double gpu_busy_ms = 0;  // time with at least one kernel or copy running on the GPU
  int64_t kernels = 0;     // kernel launches (copies and memsets not counted)
  std::vector<Kernel> by_time;  // every kernel name, most GPU time first
};

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
  // training (runtime/cuda/step_graph.cpp, runtime/cuda/gpu_profile.cpp)
  /// Runs `work` once on a side stream (the eager warm-up: its effects are real), then captures the
  /// kernels it queues into a CUDA graph (not run), sharing `share_pool_with`'s memory pool when
  /// given. Dropout's RNG goes through the default generator's graph-safe philox state: each replay
  /// reads the generator's seed and offset then. Throws what the capture threw.
  std::unique_ptr<CapturedGraph> (*capture_graph)(const std::function<void()>& work, CapturedGraph* share_pool_with);
  /// Runs `work` under the Kineto profiler with CUDA activities and synchronises.
  GpuProfile (*profile)(const std::function<void()>& work);
  /// c10's CUDA sync debug mode: 0 off, 1 warn, 2 error (an operation that syncs the host throws).
  void (*set_sync_debug_mode)(int mode);
  // sampling (model/cuda/decode_graph.cpp)
  /// An empty set of decode-step graphs, one per batch-size bucket in one memory pool, for
  /// model::StaticDecoder::capture.
  std::unique_ptr<model::StepGraphs> (*decode_graphs)();
  // the model on a GPU (model/cuda/rope_kernel.h)
  /// RoPE's rotation, one kernel forward and one backward, for model::Rope on a CUDA tensor: x
  /// (B, T, H, hs) rotated at positions start .. start + T - 1 by Rope's fp32 tables (cos2, sin2) on
  /// x's device, returned as heads [0, n_first) (B, n_first, T, hs) and the rest, contiguous;
  /// differentiable w.r.t. x. Undefined tensors for an x it does not take (another dtype).
  std::pair<at::Tensor, at::Tensor> (*rope_rotate_split)(const at::Tensor& x, const at::Tensor& cos2,
                                                         const at::Tensor& sin2, int64_t start, int64_t n_first);
  // (model/cuda/residual_norm_kernel.h)
  /// A block's residual add, dropout and norm in one kernel, for model::residual_add_norm on CUDA
  /// tensors: {h, n} = {x + dropout_p(y), LayerNorm or RMSNorm of h (when weight is defined)}, fp32;
  /// the mask drawn from the device's generator (graph-safe), or from rng = {seed, offset} when
  /// given, and drawn again in backward. Differentiable w.r.t. x, y, weight and bias. Undefined
  /// tensors for inputs it does not take.
  std::pair<at::Tensor, at::Tensor> (*residual_dropout_norm)(const at::Tensor& x, const at::Tensor& y, double p,
                                                             const at::Tensor& rng, const at::Tensor& weight,
                                                             const at::Tensor& bias, double eps, bool rms);
  // (model/cuda/cross_entropy_kernel.h)
  /// The mean cross-entropy of logits (N, V) fp32 / bf16 / fp16 against targets (N,) (-100 ignored),
  /// an fp32 scalar, summed in fp32 without an fp32 copy of the logits; differentiable w.r.t. the
  /// logits, the gradient in their dtype. Undefined for logits it does not take.
  at::Tensor (*cross_entropy)(const at::Tensor& logits, const at::Tensor& targets);
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
