// The two c10d backends, each in its own corner because their headers need more than LibTorch's:
// ProcessGroupGloo.hpp needs Gloo's headers (Debian: libgloo-dev; the wheel ships the library inside
// libtorch_cpu.so but not its headers), ProcessGroupNCCL.hpp needs CUDA's and NCCL's. CMake defines
// NANOGPT_HAVE_GLOO / NANOGPT_HAVE_NCCL for this file only when it found them (LibTorch's own
// USE_C10D_GLOO / USE_C10D_NCCL say what the library has, not what this machine can compile).
#include "train/distributed_backends.h"

#include <fmt/format.h>

#include <stdexcept>

#ifdef NANOGPT_HAVE_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef NANOGPT_HAVE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

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
#ifdef NANOGPT_HAVE_NCCL
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#else
  (void)store, (void)rank, (void)size, (void)timeout;
  throw std::runtime_error(
      "[ddp] this nanogpt was built without NCCL (a CPU-only LibTorch), so it cannot train on several GPU processes "
      "(build against the CUDA PyTorch wheel, or train with --device=cpu)");
#endif
}

bool has_gloo() {
#ifdef NANOGPT_HAVE_GLOO
  return true;
#else
  return false;
#endif
}

bool has_nccl() {
#ifdef NANOGPT_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

}  // namespace nanogpt::train
