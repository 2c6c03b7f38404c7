// What depends on the machine and on the LibTorch build: device choice, dtype choice, autocast, CUDA
// queries, threads, out-of-memory detection; the rest of the code reads the same on the CPU and on CUDA.
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>

namespace nanogpt::runtime {

/// "2.11.0", ...
std::string torch_version();

/// True when this LibTorch was built with CUDA (whether or not a GPU is present).
bool cuda_compiled();

/// The CUDA plugin (libnanogpt_cuda.so) a GPU run loads: the one beside the program (a build
/// folder), else the one in ../lib relative to it (an installed bin/ and lib/); the first of the two
/// when neither exists.
std::string cuda_plugin_path();

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
  c10::DeviceType device_type_;
  bool previous_enabled_ = false;
  torch::ScalarType previous_dtype_ = torch::kFloat;
};

/// Whether `device` multiplies bf16 matrices in hardware: a CUDA GPU of compute capability >= 8.0
/// (Ampere), or a CPU with AVX-512 BF16 or AMX. Without it LibTorch's bf16 GEMM falls back to
/// scalar code (~100x slower than fp32 on an AVX2-only CPU).
bool has_fast_bf16(torch::Device device);

/// The training dtype for config value `dtype`: "auto" becomes bfloat16 where the device has fast
/// bf16, else float16 on CUDA (with loss scaling, as nanoGPT picks) and float32 on the CPU; other
/// values are returned unchanged.
std::string resolve_dtype(const std::string& dtype, torch::Device device);

/// The training dtype for config value `dtype`: as resolve_dtype, except that on the CPU "auto"
/// becomes bfloat16 only where LibTorch's bf16 GEMM also beats its fp32 one on this machine, timed
/// once per process on a (512 x 384) @ (384 x 512) product (the best of 4 alternating rounds,
/// ~20 ms). AVX-512 BF16 without AMX is not faster everywhere: an Intel Xeon with it (family 6
/// model 207, no AMX) trained the CPU preset at 53 ms/iter in bf16 against 37 in fp32, while AMD's
/// Zen 5 gains from it. Sampling keeps resolve_dtype: the decoder streams its weights, and bf16
/// halves the bytes on either CPU.
std::string resolve_training_dtype(const std::string& dtype, torch::Device device);

/// The sampling dtype for `--dtype`: as resolve_dtype, except that on CUDA "auto" becomes float32.
/// A token at a time on a GPU is bound by kernel launches, not by the multiplies, and autocast only
/// adds a cast kernel for every weight and activation of every token: on an H200 the full-preset
/// model sampled 516 tok/s under bf16 autocast against 879 in float32.
std::string resolve_sampling_dtype(const std::string& dtype, torch::Device device);

/// The autocast dtype of a resolved dtype value: kBFloat16, kHalf, or kFloat (no autocast).
torch::ScalarType autocast_dtype(const std::string& dtype);

/// Resolves "auto" | "cpu" | "cuda" | "cuda:N" to a device, loading LibTorch's CUDA half first when
/// the name may mean a GPU (runtime/cuda_plugin.h). Throws "[device] ..." when CUDA is asked for and
/// not available (names the LibTorch build and a hint).
torch::Device resolve_device(const std::string& name);

/// The device one process trains on, from what resolve_device returned: a GPU named without an
/// index ("cuda", or "auto" that found one) becomes cuda:`local_rank` (torchrun's LOCAL_RANK; 0 for
/// a process alone), so that setting it as the current device and NCCL's communicator both work.
/// An explicit index and the CPU are kept as they are.
torch::Device process_device(torch::Device resolved, int64_t local_rank);

/// Makes `device` the current CUDA device (NCCL's, and where kernels without an explicit device
/// run); nothing for the CPU. Throws "[device] ..." for a CUDA device without an index.
void set_current_device(torch::Device device);

/// Whether float32 products on CUDA may run on TF32 tensor cores (matmuls and cuDNN; about 8x
/// fp32's rate on Ampere and later, with a 10-bit mantissa in the products, as nanoGPT allows).
/// No effect on the CPU.
void set_tf32(bool enabled);

/// A batch's inputs and targets (int64, (B, T) each, on the CPU) on `device`. On CUDA both go in one
/// copy from pinned (page-locked) host memory, queued without waiting: the host draws the next batch
/// while the GPU still computes. On the CPU they are returned as they are.
std::pair<torch::Tensor, torch::Tensor> to_device(const torch::Tensor& x, const torch::Tensor& y, torch::Device device);

/// The GPU's name ("NVIDIA H200"), or "" for the CPU or without the CUDA plugin.
std::string device_name(torch::Device device);

/// The caching allocator's high-water marks on a CUDA device, in bytes: held by tensors, and
/// reserved from the driver. Both 0 for the CPU (see runtime/host_memory.h for its resident memory).
struct GpuMemory {
  int64_t peak_allocated = 0;
  int64_t peak_reserved = 0;
};
GpuMemory peak_gpu_memory(torch::Device device);
/// Starts the high-water marks again from what is held now (no-op on the CPU).
void reset_peak_gpu_memory(torch::Device device);

/// Sets LibTorch's intra-op threads: n > 0 as given, 0 = every core.
/// Returns the number set.
int64_t set_threads(int64_t n);

/// True when `e` is an allocation failure: CUDA's c10::OutOfMemoryError, or the CPU allocator's
/// "can't allocate memory".
bool is_out_of_memory(const std::exception& e);

/// Waits for queued kernels on `device` (for honest timings on CUDA); no-op on CPU.
void synchronize(torch::Device device);

}  // namespace nanogpt::runtime
