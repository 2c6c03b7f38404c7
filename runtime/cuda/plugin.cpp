// libnanogpt_cuda.so: what needs CUDA's own headers (runtime/cuda_plugin.h says why it is apart).
// Linked against the whole of LibTorch, so opening it maps libtorch_cuda.so and its libraries.
#include "runtime/cuda_plugin.h"

#include "model/cuda/cross_entropy_kernel.h"
#include "model/cuda/decode_graph.h"
#include "model/cuda/residual_norm_kernel.h"
#include "model/cuda/rope_kernel.h"
#include "runtime/cuda/training.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <stdexcept>

#ifdef NANOGPT_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace {

int compute_capability_major(int device) { return at::cuda::getDeviceProperties(device)->major; }

std::string device_name(int device) { return at::cuda::getDeviceProperties(device)->name; }

void peak_memory(int device, int64_t* allocated, int64_t* reserved) {
  using c10::CachingAllocator::StatType;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  *allocated = stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].peak;
  *reserved = stats.reserved_bytes[static_cast<size_t>(StatType::AGGREGATE)].peak;
}

void reset_peak_memory(int device) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
}

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout) {
#ifdef NANOGPT_HAVE_NCCL
  // Blocking waits without asynchronous error handling: the nanogpt program's main set them in the
  // environment before any thread started (runtime/environment.h says why).
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#else
  (void)store, (void)rank, (void)size, (void)timeout;
  throw std::runtime_error("[ddp] this nanogpt was built without NCCL's header (nccl.h), so it cannot train on several "
                           "GPU processes (install NCCL, or use the PyTorch wheel's nvidia-nccl, and rebuild)");
#endif
}

const nanogpt::runtime::CudaPlugin kPlugin{compute_capability_major,
                                           device_name,
                                           peak_memory,
                                           reset_peak_memory,
                                           make_nccl_backend,
                                           nanogpt::runtime::cuda::capture_graph,
                                           nanogpt::runtime::cuda::profile,
                                           nanogpt::runtime::cuda::set_sync_debug_mode,
                                           nanogpt::model::cuda::decode_graphs,
                                           nanogpt::model::cuda::rope_rotate_split,
                                           nanogpt::model::cuda::residual_dropout_norm,
                                           nanogpt::model::cuda::cross_entropy};

}  // namespace

extern "C" const nanogpt::runtime::CudaPlugin* nanogpt_cuda_plugin() { return &kPlugin; }
