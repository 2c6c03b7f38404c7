// One optimizer step (see step.h).
#include "train/step.h"

#include "runtime/device.h"
#include "train/distributed.h"

namespace nanogpt::train {

void optimizer_step(FlatAdamW& optimizer, double lr, const StepOptions& options) {
  optimizer.set_lr(lr);
  update_weights(optimizer, options);
}

void update_weights(FlatAdamW& optimizer, const StepOptions& options) {
  if (options.scaler) options.scaler->unscale(optimizer.flat_grads());  // before clipping sees them
  if (optimizer.fused()) {
    // Clipping and a skipped fp16 step fold into the fused kernel: nothing is read back.
    std::optional<torch::Tensor> grad_scale, found_inf;
    if (options.grad_clip > 0.0) grad_scale = optimizer.clip_divisor(options.grad_clip);
    if (options.scaler) found_inf = options.scaler->found_inf();
    optimizer.step(grad_scale, found_inf);
  } else {
    if (options.grad_clip > 0.0) optimizer.clip_grad_norm(options.grad_clip);
    if (!options.scaler || options.scaler->step_ok()) optimizer.step(std::nullopt, std::nullopt);
  }
  if (options.scaler) options.scaler->update();
  optimizer.zero_grad();
}

namespace {

double micro_batch_share(const StepOptions& options) {
  // Each micro-batch's loss is divided by the step's micro-batches over all processes: summed
  // over the processes, the gradients are those of the mean loss, as with one process.
  return 1.0 / static_cast<double>(options.gradient_accumulation_steps * options.world_size);
}

}  // namespace

void micro_step(model::GPT& model, const torch::Tensor& x, const torch::Tensor& y, const StepOptions& options,
                torch::Tensor& loss_sum) {
  torch::Tensor loss;
  {
    runtime::AutocastGuard autocast(options.device, options.autocast_dtype, options.autocast_dtype != torch::kFloat);
    loss = model->loss(x, y);  // x, y: (B, T) each
  }
  auto micro_loss = loss * micro_batch_share(options);
  (options.scaler ? options.scaler->scale(micro_loss) : micro_loss).backward();
  loss_sum.add_(loss.detach());
}

torch::Tensor train_step(model::GPT& model, FlatAdamW& optimizer,
                         const std::function<std::pair<torch::Tensor, torch::Tensor>()>& next_batch, double lr,
                         const StepOptions& options) {
  auto loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(options.device));
  for (int64_t micro = 0; micro < options.gradient_accumulation_steps; ++micro) {
    const bool last = micro + 1 == options.gradient_accumulation_steps;
    if (options.all_reduce && last) options.all_reduce->arm();  // the earlier micro-batches only accumulate
    auto [x, y] = next_batch();  // (B, T) each
    micro_step(model, x, y, options, loss_sum);
  }
  if (options.all_reduce) options.all_reduce->finish();
  optimizer_step(optimizer, lr, options);
  return loss_sum;
}

}  // namespace nanogpt::train
