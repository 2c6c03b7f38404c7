// One optimizer step, shared by the training loop and the benchmark: gradient accumulation over
// micro-batches (under bf16 or fp16 autocast when asked), loss scaling for fp16, global-norm
// clipping, AdamW, zeroed gradients.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <optional>
#include <utility>

#include "model/gpt.h"
#include "train/adamw.h"
#include "train/grad_scaler.h"

namespace nanogpt::train {
class GradientAllReduce;
}

namespace nanogpt::train {

struct StepOptions {
  int64_t gradient_accumulation_steps = 1;
  double grad_clip = 1.0;  // 0 = off
  torch::ScalarType autocast_dtype = torch::kFloat;  // kBFloat16 / kHalf: autocast; kFloat: off
  torch::Device device = torch::kCPU;
  GradScaler* scaler = nullptr;  // float16: dynamic loss scaling; a step with inf/NaN gradients is skipped
  // Data parallel: this process runs gradient_accumulation_steps of the step's world_size times as
  // many micro-batches, and `all_reduce` sums the gradients over the processes before clipping.
  int64_t world_size = 1;
  GradientAllReduce* all_reduce = nullptr;
};

/// One micro-batch of a step: the forward pass (under autocast when asked), the backward pass of
/// its share of the step's loss (loss scaled for fp16), and its loss added in place to `loss_sum`
/// (0-d float32 on the device). Reads nothing back: a CUDA graph can hold it.
void micro_step(model::GPT& model, const torch::Tensor& x, const torch::Tensor& y, const StepOptions& options,
                torch::Tensor& loss_sum);

/// The end of a step, after the last backward: the learning rate written (set_lr), then
/// update_weights.
void optimizer_step(FlatAdamW& optimizer, double lr, const StepOptions& options);
/// Unscales the gradients (fp16), clips them, updates the weights at the optimizer's learning rate
/// (a skipped fp16 step changes nothing), adjusts the loss scale and zeroes the gradients. With the
/// fused optimizer nothing here reads the device: a CUDA graph can hold it.
void update_weights(FlatAdamW& optimizer, const StepOptions& options);

/// Runs one step at learning rate `lr`, drawing each micro-batch (x, y) from `next_batch`.
/// Returns the sum of this process's micro-batch losses as a 0-d tensor (no host sync).
torch::Tensor train_step(model::GPT& model, FlatAdamW& optimizer,
                         const std::function<std::pair<torch::Tensor, torch::Tensor>()>& next_batch, double lr,
                         const StepOptions& options);

}  // namespace nanogpt::train
