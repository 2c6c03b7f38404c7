// Row-wise filters and the exponential-race draw in tensor operations (see device_sampling.h).
#include "model/device_sampling.h"

#include <limits>

namespace nanogpt::model {

RowOptions::RowOptions(int64_t slots, torch::Device device) {
  const auto f = torch::TensorOptions().dtype(torch::kFloat).device(device);
  temperature = torch::ones({slots}, f);
  top_k = torch::zeros({slots}, torch::TensorOptions().dtype(torch::kLong).device(device));
  top_p = torch::ones({slots}, f);
}

void RowOptions::set(int64_t row, double t, int64_t k, double p) {
  temperature.narrow(0, row, 1).fill_(t);
  top_k.narrow(0, row, 1).fill_(k);
  top_p.narrow(0, row, 1).fill_(p);
}

torch::Tensor filtered_probs_rows(const torch::Tensor& logits, const RowOptions& options) {
  auto x = logits.to(torch::kFloat);  // (B, V)
  const int64_t B = x.size(0), V = x.size(1);
  auto temperature = options.temperature.narrow(0, 0, B), top_k = options.top_k.narrow(0, 0, B),
       top_p = options.top_p.narrow(0, 0, B);
  auto greedy = (temperature <= 0).unsqueeze(1);  // (B, 1)
  x = x / torch::where(greedy, torch::ones_like(temperature).unsqueeze(1), temperature.unsqueeze(1));
  // Top-k: below the k-th largest (ties kept), -inf; k = 0 or >= V keeps all (the V-th largest is the least).
  auto k = torch::where((top_k > 0) & (top_k < V), top_k, torch::full_like(top_k, V)) - 1;  // (B,)
  auto kth = std::get<0>(x.sort(-1, /*descending=*/true)).gather(1, k.unsqueeze(1));       // (B, 1)
  auto probs = torch::softmax(x.masked_fill(x < kth, -std::numeric_limits<float>::infinity()), -1);  // (B, V)
  // Top-p: keep a token while the mass before it (in descending order) is below top_p; 1 = off.
  auto [sorted, order] = probs.sort(-1, /*descending=*/true);  // (B, V)
  auto before = sorted.cumsum(-1) - sorted;
  auto limit = torch::where(top_p < 1, top_p, torch::full_like(top_p, 2.0)).unsqueeze(1);  // (B, 1)
  auto drop = torch::zeros_like(before, torch::kBool).scatter_(1, order, before >= limit);
  probs = probs.masked_fill(drop, 0.0);
  probs = probs / probs.sum(-1, /*keepdim=*/true);
  auto one_hot = torch::zeros_like(probs).scatter_(1, logits.to(torch::kFloat).argmax(-1, /*keepdim=*/true), 1.0);
  return torch::where(greedy, one_hot, probs);
}

torch::Tensor draw_rows(const torch::Tensor& probs, std::optional<torch::Generator> generator) {
  auto race = torch::empty_like(probs).exponential_(1.0, generator);  // (B, V) ~ Exp(1)
  // An exponential of exactly 0 would make a zero-probability token 0/0.
  race.clamp_min_(std::numeric_limits<float>::min());
  return (probs / race).argmax(-1);  // (B,) int64
}

}  // namespace nanogpt::model
