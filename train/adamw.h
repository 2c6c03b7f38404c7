// AdamW over flattened parameters. Every parameter of a group becomes a view into one contiguous
// buffer, and so does its gradient, so an optimizer step, a zero_grad and the global grad norm are
// a handful of large kernels instead of a handful per parameter. Two groups, built in the model's
// parameter order: weight decay on the >= 2-D weights (matmuls, embeddings), none on norms/biases.
// Update rule and defaults are PyTorch's AdamW (decoupled weight decay, bias-corrected moments).
// With `muon` on, a third group takes the blocks' 2-D weight matrices and updates them with Muon
// (train/muon.h) at learning rate lr * muon_lr_scale; AdamW keeps embeddings, head, norms and biases.
// With `fused` (the default on CUDA) the AdamW groups step through ATen's _fused_adamw_ with the
// learning rate and the step count in device tensors: the schedule writes the rate in place
// (set_lr), gradient clipping and fp16 loss scaling fold into the kernel's grad_scale and
// found_inf, and nothing is read back to the host, so a whole step can be one CUDA graph.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace nanogpt::train {
struct TrainConfig;

class FlatAdamW {
 public:
  struct Options {
    double weight_decay = 0.1;
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    bool muon = false;           // Muon for the matrices inside the blocks (names "h.*", 2-D)
    double muon_lr_scale = 1.0;  // Muon's learning rate / AdamW's (both follow one schedule)
    double muon_momentum = 0.95;
    torch::ScalarType muon_dtype = torch::kBFloat16;  // Newton–Schulz arithmetic (fp32 where bf16 is slow)
    std::optional<bool> fused = std::nullopt;  // ATen's _fused_adamw_; unset: on for CUDA parameters, off on a CPU
  };

  /// Takes over `named_params` (rebinding their storage into the flat buffers).
  FlatAdamW(const std::vector<std::pair<std::string, torch::Tensor>>& named_params, Options options);
  /// Takes over every parameter of `module` (a model), by name, in the module's order.
  FlatAdamW(const torch::nn::Module& module, Options options);

  /// Clips the global L2 norm of all gradients to max_norm (no host sync); returns the norm before
  /// clipping as a 0-d tensor.
  torch::Tensor clip_grad_norm(double max_norm);
  /// One AdamW update with learning rate lr (set_lr, then the step below).
  void step(double lr);

  /// Whether the AdamW groups step through ATen's fused kernel (Options::fused).
  bool fused() const { return fused_; }
  /// Writes the learning rate of the next step into its device tensor (in place: a CUDA graph that
  /// captured the step reads the new value).
  void set_lr(double lr);
  /// The learning rate tensor the fused step reads (0-d float32 on the parameters' device).
  const torch::Tensor& lr_tensor() const { return lr_; }
  /// The divisor that clips the global gradient norm to max_norm, max(1, (norm + 1e-6) / max_norm),
  /// as a 0-d float32 device tensor (no host sync): the fused step's grad_scale. The gradients are
  /// left as they are.
  torch::Tensor clip_divisor(double max_norm) const;
  /// One update at the rate set_lr wrote, with every gradient divided by `grad_scale` first (when
  /// given: clipping, see clip_divisor) and nothing changed where `found_inf` (a float32 (1,) device
  /// tensor, the loss scaler's) is 1: a skipped fp16 step leaves the weights, the moments and the
  /// step count as they were. Fused: no host sync, except with Muon and found_inf (Muon's own
  /// update reads the flag). Unfused: the gradients are divided and the flag read on the host.
  void step(const std::optional<torch::Tensor>& grad_scale, const std::optional<torch::Tensor>& found_inf);
  /// Zeroes the gradients in place (they stay views into the flat buffer).
  void zero_grad();
  /// The flat gradient buffers, one per group (every parameter's .grad() is a view into one).
  std::vector<torch::Tensor> flat_grads() const { return {groups_[0].grad, groups_[1].grad, groups_[2].grad}; }

  /// Every buffer the optimizer made, empty groups' included: each group's parameters, gradients
  /// and moments. All share the parameters' device and dtype.
  std::vector<torch::Tensor> buffers() const;

  /// Steps taken (skipped fp16 steps not counted); reads the device counter when fused.
  int64_t steps() const;
  /// Names of the parameters in the decay / no-decay groups, in order.
  const std::vector<std::string>& decay_names() const { return groups_[0].names; }
  const std::vector<std::string>& no_decay_names() const { return groups_[1].names; }
  int64_t decay_numel() const { return groups_[0].flat.numel(); }
  int64_t no_decay_numel() const { return groups_[1].flat.numel(); }
  const std::vector<std::string>& muon_names() const { return groups_[2].names; }
  int64_t muon_numel() const { return groups_[2].flat.numel(); }

  /// The state to checkpoint: "step" (0-d int64) and the moments "exp_avg.decay",
  /// "exp_avg_sq.decay", "exp_avg.no_decay", "exp_avg_sq.no_decay" (each (numel,) of its group),
  /// and with Muon "momentum.muon".
  std::vector<std::pair<std::string, torch::Tensor>> state() const;
  /// Restores what state() returned (in any order). Throws std::runtime_error
  /// "[ckpt] optimizer state 'exp_avg.decay' has 123 values, expected 456" on a mismatch, and
  /// "[ckpt] optimizer state 'step' is missing" (or malformed).
  void load_state(const std::vector<std::pair<std::string, torch::Tensor>>& state);

 private:
  struct Group {
    std::vector<std::string> names;
    std::vector<torch::Tensor> params;
    double weight_decay = 0.0;
    torch::Tensor flat, grad, exp_avg, exp_avg_sq;  // each (numel,); Muon's momentum is exp_avg
  };
  void flatten(Group& group);
  bool on_cpu_fp32() const;  // the buffers are fp32 on the CPU: the fused loop applies
  void fused_step_cpu(Group& group, double lr, double bias1, double bias2);
  void loop_step(double lr);  // the update without ATen's fused kernel (host-side lr and step count)
  void muon_step(Group& group, double lr);

  Options options_;
  std::optional<torch::TensorOptions> options_of_params_;  // device and dtype of the first parameter
  int64_t step_ = 0;     // unfused: steps taken
  bool fused_ = false;
  double lr_value_ = 0;  // what set_lr wrote last (Muon's rate, and the unfused update's)
  torch::Tensor lr_;     // 0-d float32 on the parameters' device
  torch::Tensor step_count_;  // fused: 0-d float32 on the parameters' device, ATen's state_steps
  Group groups_[3];  // [0] decay, [1] no decay (AdamW), [2] Muon (empty unless options.muon)
};

/// The optimizer a config trains with (weight decay, betas, Muon and its settings; Newton–Schulz in
/// bf16 where the run autocasts to bf16, else fp32): one place for the trainer and `bench`.
FlatAdamW::Options optimizer_options(const TrainConfig& config);

}  // namespace nanogpt::train
