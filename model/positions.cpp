// Sinusoidal and rotary position tables (see positions.h).
#include "model/positions.h"

#include <cmath>

namespace nanogpt::model {

torch::Tensor sinusoidal_table(int64_t n_positions, int64_t n_embd) {
  auto pos = torch::arange(n_positions, torch::kDouble).unsqueeze(1);                    // (P, 1)
  auto two_i = torch::arange(0, n_embd, 2, torch::kDouble);                              // (C/2,)
  auto angle = pos * torch::exp(two_i * (-std::log(10000.0) / static_cast<double>(n_embd)));  // (P, C/2)
  auto table = torch::stack({angle.sin(), angle.cos()}, /*dim=*/2);                     // (P, C/2, 2)
  return table.reshape({n_positions, n_embd}).to(torch::kFloat);                        // (P, C): sin, cos interleaved
}

Rope::Rope(int64_t block_size, int64_t head_size, double base) : half_(head_size / 2) {
  auto i = torch::arange(half_, torch::kDouble);                                          // (hs/2,)
  auto theta = torch::pow(base, -2.0 * i / static_cast<double>(head_size));              // (hs/2,)
  auto angle = torch::arange(block_size, torch::kDouble).unsqueeze(1) * theta;           // (T, hs/2)
  cos_ = angle.cos().to(torch::kFloat);
  sin_ = angle.sin().to(torch::kFloat);
}

torch::Tensor Rope::apply(const torch::Tensor& x, int64_t start_pos) {
  if (cos_.device() != x.device()) {
    cos_ = cos_.to(x.device());
    sin_ = sin_.to(x.device());
  }
  const int64_t T = x.size(2);
  auto cos = cos_.narrow(0, start_pos, T).to(x.scalar_type());  // (T, hs/2)
  auto sin = sin_.narrow(0, start_pos, T).to(x.scalar_type());
  auto x1 = x.narrow(-1, 0, half_);      // (B, nh, T, hs/2)
  auto x2 = x.narrow(-1, half_, half_);  // (B, nh, T, hs/2)
  return torch::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);  // (B, nh, T, hs)
}

}  // namespace nanogpt::model
