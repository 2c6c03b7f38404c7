// Fixed micro-batch buffers (see device_batch.h).
#include "train/device_batch.h"

#include <c10/core/impl/VirtualGuardImpl.h>

namespace nanogpt::train {

DeviceBatch::DeviceBatch(int64_t batch_size, int64_t block_size, torch::Device device) : device_(device) {
  const auto host = torch::TensorOptions().dtype(torch::kInt64).pinned_memory(device.is_cuda());
  staging_ = torch::empty({2, batch_size, block_size}, host);  // (2, B, T)
  staged_x_ = staging_[0];
  staged_y_ = staging_[1];
  on_device_ = device.is_cpu() ? staging_ : torch::empty({2, batch_size, block_size}, host.device(device).pinned_memory(false));
  x_ = on_device_[0];
  y_ = on_device_[1];
  if (device.is_cuda()) copied_.emplace(device.type());
}

void DeviceBatch::load(data::BatchSampler& sampler) {
  if (device_.is_cpu()) {
    sampler.next_into(staged_x_, staged_y_);  // the buffers themselves
    return;
  }
  if (copied_) copied_->synchronize();  // the last copy out of staging_ has read it
  sampler.next_into(staged_x_, staged_y_);
  on_device_.copy_(staging_, /*non_blocking=*/true);
  if (copied_) copied_->record(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
}

}  // namespace nanogpt::train
