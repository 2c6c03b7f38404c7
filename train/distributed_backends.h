// The c10d backends nanogpt can create (see distributed_backends.cpp for why they live apart).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

namespace nanogpt::train {

/// ProcessGroupGloo over TCP (CPU tensors); throws "[ddp] ..." in a build without Gloo's headers.
c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout);
/// ProcessGroupNCCL (CUDA tensors, one GPU per process), from the CUDA plugin; throws "[ddp] ..." when
/// CUDA support is not loaded or was built without NCCL.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                    std::chrono::milliseconds timeout);
/// Whether this build can create ProcessGroupGloo (it found Gloo's headers).
bool has_gloo();

}  // namespace nanogpt::train
