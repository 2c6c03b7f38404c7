// libnanogpt_cuda.so: what needs CUDA's own headers (runtime/cuda_plugin.h says why it is apart).
// Linked against the whole of LibTorch, so opening it maps libtorch_cuda.so and its libraries.
#include "runtime/cuda_plugin.h"

#include <ATen/cuda/CUDAContext.h>

#include <stdexcept>

#ifdef NANOGPT_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace {

int compute_capability_major(int device) { return at::cuda::getDeviceProperties(device)->major; }

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout) {
#ifdef NANOGPT_HAVE_NCCL
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#else
  (void)store, (void)rank, (void)size, (void)timeout;
  throw std::runtime_error("[ddp] this nanogpt was built without NCCL's header (nccl.h), so it cannot train on several "
                           "GPU processes (install NCCL, or use the PyTorch wheel's nvidia-nccl, and rebuild)");
#endif
}

const nanogpt::runtime::CudaPlugin kPlugin{compute_capability_major, make_nccl_backend};

}  // namespace

extern "C" const nanogpt::runtime::CudaPlugin* nanogpt_cuda_plugin() { return &kPlugin; }
