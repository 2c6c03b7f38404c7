// Sinusoidal and rotary position tables (see positions.h).
#include "model/positions.h"

#include <algorithm>
#include <cmath>

#include "model/fast/rope.h"
#include "runtime/cuda_plugin.h"

namespace nanogpt::model {

torch::Tensor sinusoidal_table(int64_t n_positions, int64_t n_embd) {
  auto pos = torch::arange(n_positions, torch::kDouble).unsqueeze(1);                    // (P, 1)
  auto two_i = torch::arange(0, n_embd, 2, torch::kDouble);                              // (C/2,)
  auto angle = pos * torch::exp(two_i * (-std::log(10000.0) / static_cast<double>(n_embd)));  // (P, C/2)
  auto table = torch::stack({angle.sin(), angle.cos()}, /*dim=*/2);                     // (P, C/2, 2)
  return table.reshape({n_positions, n_embd}).to(torch::kFloat);                        // (P, C): sin, cos interleaved
}

Rope::Rope(int64_t block_size, int64_t head_size, double base) : half_(head_size / 2), base_(base) {
  cover(block_size);
}

void Rope::cover(int64_t n_positions) {
  const int64_t have = cos2_.defined() ? cos2_.size(0) : 0;
  if (n_positions <= have) return;
  const int64_t rows = std::max(n_positions, 2 * have);
  auto i = torch::arange(half_, torch::kDouble);                                           // (hs/2,)
  auto theta = torch::pow(base_, -2.0 * i / static_cast<double>(2 * half_));               // (hs/2,)
  auto angle = torch::arange(rows, torch::kDouble).unsqueeze(1) * theta;                   // (P, hs/2)
  auto cos = angle.cos(), sin = angle.sin();                                               // (P, hs/2)
  cos2_ = torch::cat({cos, cos}, -1).to(torch::kFloat).unsqueeze(1);                      // (P, 1, hs)
  sin2_ = torch::cat({-sin, sin}, -1).to(torch::kFloat).unsqueeze(1);                     // (P, 1, hs)
  cos2_cast_ = sin2_cast_ = torch::Tensor();
}

namespace {

// [x2, x1]: the halves of the last dim swapped.
torch::Tensor swap_halves(const torch::Tensor& x) {
  auto halves = x.chunk(2, -1);                    // x1, x2: (..., hs/2) each
  return torch::cat({halves[1], halves[0]}, -1);   // (..., hs)
}

// y = x * cos2 + swap_halves(x) * sin2. Its gradient is the same kind of rotation of the incoming
// gradient, dx = dy * cos2 + swap_halves(dy * sin2) (swap_halves is its own inverse), so nothing of
// x is kept for backward; autograd's own graph of these three kernels keeps x and swap_halves(x),
// 50 MB per layer at the full preset.
struct RopeRotation : public torch::autograd::Function<RopeRotation> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin) {
    ctx->save_for_backward({cos, sin});  // table rows, not activations
    return torch::addcmul(x * cos, swap_halves(x), sin);  // [x1 cos - x2 sin, x2 cos + x1 sin]
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto& dy = grads[0];
    return {dy * saved[0] + swap_halves(dy * saved[1]), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

std::pair<torch::Tensor, torch::Tensor> Rope::tables(int64_t n_positions, torch::Device device,
                                                   torch::ScalarType dtype) {
  cover(n_positions);
  if (!cos2_cast_.defined() || cos2_cast_.scalar_type() != dtype || cos2_cast_.device() != device) {
    cos2_cast_ = cos2_.to(device, dtype);
    sin2_cast_ = sin2_.to(device, dtype);
  }
  return {cos2_cast_, sin2_cast_};
}

torch::Tensor Rope::apply_reference(const torch::Tensor& x, int64_t start_pos) {
  const int64_t T = x.size(1);
  auto [cos2, sin2] = tables(start_pos + T, x.device(), x.scalar_type());
  auto cos = cos2.narrow(0, start_pos, T);  // (T, 1, hs)
  auto sin = sin2.narrow(0, start_pos, T);
  return RopeRotation::apply(x, cos, sin);  // (B, T, H, hs)
}

std::optional<std::pair<torch::Tensor, torch::Tensor>> Rope::fused_split(const torch::Tensor& x, int64_t start_pos,
                                                                         int64_t n_first) {
  const int64_t end = start_pos + x.size(1);
  cover(end);
  if (rope_rotate_applies(x)) return rope_rotate_split(x, cos2_, sin2_, start_pos, n_first);  // (fast/rope.h)
  // On a GPU the plugin's kernel, when a GPU run loaded it (runtime::resolve_device does).
  const runtime::CudaPlugin* plugin = x.is_cuda() ? runtime::cuda_plugin() : nullptr;
  if (!plugin || !plugin->rope_rotate_split) return std::nullopt;
  auto [cos2, sin2] = tables(end, x.device(), torch::kFloat);
  auto parts = plugin->rope_rotate_split(x, cos2, sin2, start_pos, n_first);
  if (!parts.first.defined()) return std::nullopt;  // a dtype it has no kernel for
  return parts;
}

torch::Tensor Rope::apply(const torch::Tensor& x, int64_t start_pos) {
  if (auto fused = fused_split(x, start_pos, x.size(2))) return fused->first.transpose(1, 2);  // (B, T, H, hs)
  return apply_reference(x, start_pos);
}

std::pair<torch::Tensor, torch::Tensor> Rope::apply_split(const torch::Tensor& x, int64_t start_pos, int64_t n_first) {
  if (auto fused = fused_split(x, start_pos, n_first)) return *std::move(fused);
  auto parts = apply_reference(x, start_pos).split_with_sizes({n_first, x.size(2) - n_first}, 2);
  return {parts[0].transpose(1, 2), parts[1].transpose(1, 2)};
}

}  // namespace nanogpt::model
