// A training step replayed as CUDA graphs (see graphed_step.h).
#include "train/graphed_step.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <tuple>

#include "runtime/device.h"

namespace nanogpt::train {

CudaGraphChoice resolve_cuda_graphs(const std::string& setting, torch::Device device, int64_t world_size,
                                    bool fused_optimizer) {
  if (setting != "auto" && setting != "true" && setting != "false")
    throw std::runtime_error("[config] cuda_graphs must be auto, true or false, not '" + setting + "'");
  if (setting == "false") return {};
  const bool asked = setting == "true";
  if (!device.is_cuda())
    return {false, asked ? "[train] cuda_graphs: true has no effect on " + device.str() + ": the steps run eagerly" : ""};
  if (world_size > 1)
    return {false, fmt::format("[ddp] CUDA graphs off with {} processes: the gradient all-reduce runs between the "
                               "micro-batches on the host's schedule; the steps run eagerly",
                               world_size)};
  if (!fused_optimizer)
    return {false, "[train] CUDA graphs off: the optimizer is not the fused one (its step count lives on the host)"};
  return {true, ""};
}

GraphedStep::GraphedStep(model::GPT& model, FlatAdamW& optimizer, StepOptions options, int64_t warmup_steps,
                         std::function<void(const std::string&)> log)
    : model_(model), optimizer_(optimizer), options_(options), warmup_steps_(warmup_steps), log_(std::move(log)) {
  if (options_.all_reduce)
    throw std::runtime_error("[train] CUDA graphs cannot hold the gradient all-reduce (set cuda_graphs: false)");
  loss_sum_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(options_.device));
}

torch::Tensor GraphedStep::step(const std::function<std::pair<torch::Tensor, torch::Tensor>()>& next_batch, double lr) {
  loss_sum_.zero_();
  optimizer_.set_lr(lr);  // in place: the captured update reads it
  if (micro_graph_) {
    for (int64_t micro = 0; micro < options_.gradient_accumulation_steps; ++micro) {
      const auto [x, y] = next_batch();
      if (x.data_ptr() != x_.data_ptr() || y.data_ptr() != y_.data_ptr())
        throw std::runtime_error("[train] CUDA graphs: a micro-batch came in other buffers than the captured ones");
      micro_graph_->replay();
    }
    update_graph_->replay();
  } else if (failed_ || steps_ < warmup_steps_) {
    eager_step(next_batch, 0);
  } else {
    capture_step(next_batch);
  }
  ++steps_;
  return loss_sum_;
}

void GraphedStep::eager_step(const std::function<std::pair<torch::Tensor, torch::Tensor>()>& next_batch,
                             int64_t from_micro) {
  for (int64_t micro = from_micro; micro < options_.gradient_accumulation_steps; ++micro) {
    const auto [x, y] = next_batch();
    micro_step(model_, x, y, options_, loss_sum_);
  }
  update_weights(optimizer_, options_);
}

// A real step: capture_graph runs each piece once for real before recording it, so the first
// micro-batch and the update run eagerly on the side stream and the other micro-batches replay.
// When capture fails the step is finished eagerly from where it got to.
void GraphedStep::capture_step(const std::function<std::pair<torch::Tensor, torch::Tensor>()>& next_batch) {
  std::tie(x_, y_) = next_batch();
  int micro_runs = 0, update_runs = 0;  // a second run is the capture: the eager one completed
  int64_t micros_done = 0;
  bool update_done = false;
  try {
    const runtime::CudaPlugin* plugin = runtime::cuda_plugin();
    if (!plugin) throw std::runtime_error("the CUDA plugin is not loaded");
    micro_graph_ = plugin->capture_graph(
        [&] {
          ++micro_runs;
          micro_step(model_, x_, y_, options_, loss_sum_);
        },
        nullptr);
    micros_done = 1;
    for (; micros_done < options_.gradient_accumulation_steps; ++micros_done) {
      next_batch();  // into x_ and y_
      micro_graph_->replay();
    }
    update_graph_ = plugin->capture_graph(
        [&] {
          ++update_runs;
          update_weights(optimizer_, options_);
        },
        micro_graph_.get());
  } catch (const std::exception& e) {
    if (micro_runs == 1 || update_runs == 1) throw;  // an eager run failed: a real error, not the capture
    if (micro_runs >= 2) micros_done = std::max<int64_t>(micros_done, 1);
    update_done = update_runs >= 2;
    update_graph_.reset();
    micro_graph_.reset();
    failed_ = true;
    const std::string what = e.what();
    if (log_)
      log_(fmt::format("[train] CUDA graphs off: capturing the step failed ({}); training goes on eagerly",
                       what.substr(0, what.find('\n'))));
    if (micros_done == 0) {
      micro_step(model_, x_, y_, options_, loss_sum_);  // its batch is loaded already
      micros_done = 1;
    }
    if (!update_done) eager_step(next_batch, micros_done);
  }
}

}  // namespace nanogpt::train
