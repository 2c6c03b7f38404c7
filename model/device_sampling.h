// Temperature, top-k, top-p and the draw for a batch of rows, each with its own options, in tensor
// operations only: no host read and no shape that depends on a value, so that they run inside a
// captured CUDA graph as well as on the CPU. The filters are filtered_probs_tensors' (model/generate.h)
// with the options as (B,) tensors; the draw is the exponential race: argmax_i p_i / e_i with
// e_i ~ Exp(1) picks i with probability p_i (it is the Gumbel-max trick, exp'd), and the exponentials
// come from a LibTorch generator (the device's graph-safe one on CUDA).
#pragma once

#include <torch/torch.h>

#include <optional>

namespace nanogpt::model {

/// Each row's sampling options, (S,) tensors on the model's device.
struct RowOptions {
  torch::Tensor temperature;  // (S,) fp32; 0 = greedy
  torch::Tensor top_k;        // (S,) int64; 0 = off
  torch::Tensor top_p;        // (S,) fp32; 1 = off

  RowOptions() = default;
  RowOptions(int64_t slots, torch::Device device);
  /// Sets row `row` (a small host-to-device copy).
  void set(int64_t row, double temperature, int64_t top_k, double top_p);
};

/// Probabilities after each row's temperature, top-k and top-p, as filtered_probs_tensors gives for
/// that row's options (greedy rows one-hot at the first argmax). logits (B, V), options' first B
/// rows; returns (B, V) fp32.
torch::Tensor filtered_probs_rows(const torch::Tensor& logits, const RowOptions& options);

/// One token for each row of probs (B, V): argmax(p / e), e ~ Exp(1) from `generator` (the device's
/// default when none). A zero-probability token is never drawn unless the row is all zeros.
torch::Tensor draw_rows(const torch::Tensor& probs, std::optional<torch::Generator> generator = std::nullopt);

}  // namespace nanogpt::model
