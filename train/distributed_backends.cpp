// The two c10d backends, each in its own corner because their headers need more than LibTorch's:
// ProcessGroupGloo.hpp needs Gloo's headers (Debian: libgloo-dev; the wheel ships the library inside
// libtorch_cpu.so but not its headers): CMake defines NANOGPT_HAVE_GLOO for this file only when it
// found them (LibTorch's own USE_C10D_GLOO says what the library has, not what this machine can
// compile). ProcessGroupNCCL.hpp needs CUDA's and NCCL's headers and libtorch_cuda.so: it lives in
// the CUDA plugin (runtime/cuda_plugin.h), loaded only for a GPU run.
#include "train/distributed_backends.h"

#include <fmt/format.h>

#include <stdexcept>

#ifdef NANOGPT_HAVE_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#include "runtime/cuda_plugin.h"

namespace nanogpt::train {

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout) {
#ifdef NANOGPT_HAVE_GLOO
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  // The interface the host name resolves to (loopback on one machine), or GLOO_SOCKET_IFNAME.
  options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  options->threads = 2;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
#else
  (void)store, (void)rank, (void)size, (void)timeout;
  throw std::runtime_error(
      "[ddp] this nanogpt was built without Gloo's headers, so it cannot train on several CPU processes "
      "(install libgloo-dev and rebuild: scripts/setup.sh && scripts/build.sh)");
#endif
}

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout) {
  const runtime::CudaPlugin* plugin = runtime::cuda_plugin();  // loaded by resolve_device for a CUDA device
  if (!plugin)
    throw std::runtime_error(
        "[ddp] this nanogpt has no CUDA support loaded (a CPU-only LibTorch, or a CPU device), so it cannot train on "
        "several GPU processes with NCCL (build against the CUDA PyTorch wheel, or use backend: gloo / device: cpu)");
  return plugin->make_nccl_backend(store, rank, size, timeout);
}

bool has_gloo() {
#ifdef NANOGPT_HAVE_GLOO
  return true;
#else
  return false;
#endif
}


}  // namespace nanogpt::train
