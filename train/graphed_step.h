// A training step replayed as CUDA graphs (the cuda_graphs config key). After a few eager warm-up
// steps, one micro-batch's forward and backward pass is captured as one graph and the end of the
// step (unscale, clip, the fused AdamW update, the loss scale, zeroed gradients) as another; each
// step then costs one replay per micro-batch and one for the update, instead of hundreds of kernel
// launches. Inputs stay in fixed buffers (train/device_batch.h), the learning rate in the
// optimizer's device tensor, and dropout's RNG follows the generator's seed and offset at each
// replay, so a replayed step computes what the eager one would. The graphs themselves are made by
// the CUDA plugin (runtime/cuda/step_graph.cpp).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "model/gpt.h"
#include "runtime/cuda_plugin.h"
#include "train/adamw.h"
#include "train/step.h"

namespace nanogpt::train {

/// Whether a run steps through CUDA graphs, and a line saying why when the setting was not taken
/// as asked.
struct CudaGraphChoice {
  bool on = false;
  std::string note;  // "" when nothing needs saying
};

/// Resolves the cuda_graphs setting: "auto" is on for one process on CUDA with the fused optimizer,
/// off on a CPU, under data parallel (the gradient all-reduce runs between micro-batches, on the
/// host's schedule) and with the unfused optimizer; "true" asks for them, and is turned off with a
/// note where they cannot run; "false" is off. Throws "[config] cuda_graphs ..." for another value.
CudaGraphChoice resolve_cuda_graphs(const std::string& setting, torch::Device device, int64_t world_size,
                                    bool fused_optimizer);

class GraphedStep {
 public:
  /// Steps `model` with `optimizer` (fused) as `options` says (no all-reduce), eagerly for the first
  /// `warmup_steps` steps, then through graphs. `log` gets the one line said when capture fails.
  GraphedStep(model::GPT& model, FlatAdamW& optimizer, StepOptions options, int64_t warmup_steps,
              std::function<void(const std::string&)> log);

  /// One step at learning rate `lr`, each micro-batch from `next_batch`, which must return the
  /// same two tensors every time (DeviceBatch's) with the next batch in them. Returns the sum of
  /// the micro-batch losses: a 0-d float32 device tensor, overwritten by the next step.
  torch::Tensor step(const std::function<std::pair<torch::Tensor, torch::Tensor>()>& next_batch, double lr);

  /// Whether the steps replay graphs now (false before capture and after a failed one).
  bool replaying() const { return micro_graph_ != nullptr; }
  /// Whether capture failed and every step is eager from then on.
  bool failed() const { return failed_; }

 private:
  void eager_step(const std::function<std::pair<torch::Tensor, torch::Tensor>()>& next_batch, int64_t from_micro);
  void capture_step(const std::function<std::pair<torch::Tensor, torch::Tensor>()>& next_batch);

  model::GPT model_;
  FlatAdamW& optimizer_;
  StepOptions options_;
  int64_t warmup_steps_;
  int64_t steps_ = 0;
  bool failed_ = false;
  std::function<void(const std::string&)> log_;
  torch::Tensor loss_sum_;  // 0-d float32 on the device, zeroed at each step's start
  torch::Tensor x_, y_;     // the buffers the graphs read
  std::unique_ptr<runtime::CapturedGraph> micro_graph_, update_graph_;
};

}  // namespace nanogpt::train
