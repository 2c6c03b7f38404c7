// One optimizer step (see step.h).
#include "train/step.h"

#include "runtime/device.h"
#include "train/distributed.h"

namespace nanogpt::train {

torch::Tensor train_step(model::GPT& model, FlatAdamW& optimizer,
                         const std::function<std::pair<torch::Tensor, torch::Tensor>()>& next_batch, double lr,
                         const StepOptions& options) {
  torch::Tensor loss_sum;
  // Each micro-batch's loss is divided by the step's micro-batches over all processes: summed
  // over the processes, the gradients are those of the mean loss, as with one process.
  const double scale = 1.0 / static_cast<double>(options.gradient_accumulation_steps * options.world_size);
  for (int64_t micro = 0; micro < options.gradient_accumulation_steps; ++micro) {
    const bool last = micro + 1 == options.gradient_accumulation_steps;
    if (options.all_reduce && last) options.all_reduce->arm();  // the earlier micro-batches only accumulate
    auto [x, y] = next_batch();  // (B, T) each
    torch::Tensor loss;
    {
      runtime::AutocastGuard autocast(options.device, options.autocast_dtype,
                                             options.autocast_dtype != torch::kFloat);
      loss = model->forward(x, y).second;
    }
    auto micro_loss = loss * scale;
    (options.scaler ? options.scaler->scale(micro_loss) : micro_loss).backward();
    loss_sum = loss_sum.defined() ? loss_sum + loss.detach() : loss.detach();
  }
  if (options.all_reduce) options.all_reduce->finish();
  if (options.scaler) options.scaler->unscale(optimizer.flat_grads());  // before clipping sees them
  if (options.grad_clip > 0.0) optimizer.clip_grad_norm(options.grad_clip);
  if (!options.scaler || options.scaler->step_ok()) optimizer.step(lr);
  if (options.scaler) options.scaler->update();
  optimizer.zero_grad();
  return loss_sum;
}

}  // namespace nanogpt::train
