// The fixed buffers a training step's micro-batches land in. Every micro-batch of every step fills
// the same two device tensors, so a CUDA graph that captured a step reads its inputs from where the
// next batch is: on CUDA through one pinned (page-locked) host staging buffer, reused for every
// micro-batch, and one asynchronous copy; on the CPU the sampler writes the buffers themselves.
#pragma once

#include <torch/torch.h>

#include <c10/core/Event.h>

#include <optional>

#include "data/batch_sampler.h"

namespace nanogpt::train {

class DeviceBatch {
 public:
  /// Buffers for (B, T) = (batch_size, block_size) micro-batches on `device`.
  DeviceBatch(int64_t batch_size, int64_t block_size, torch::Device device);

  /// Draws the next micro-batch from `sampler` into x() and y(). On CUDA the host first waits for
  /// the copy of the batch before (an event on the stream, not a device-wide sync: the GPU still
  /// computes on it), writes the staging buffer, and queues the copy without waiting for it.
  void load(data::BatchSampler& sampler);

  /// The inputs and targets, int64 (B, T) each, always the same tensors.
  const torch::Tensor& x() const { return x_; }
  const torch::Tensor& y() const { return y_; }

 private:
  torch::Device device_;
  torch::Tensor staging_;  // (2, B, T) int64 on the host, pinned on CUDA; the buffers themselves on the CPU
  torch::Tensor staged_x_, staged_y_;  // views of staging_
  torch::Tensor on_device_;            // (2, B, T) on the device
  torch::Tensor x_, y_;                // views of on_device_
  std::optional<c10::Event> copied_;   // CUDA: recorded after each copy out of staging_
};

}  // namespace nanogpt::train
