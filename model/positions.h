// Position information, three ways (ModelConfig::pos_encoding):
//  - learned:    a trained table wpe (block_size, C) added to the token embeddings (nanoGPT, GPT-2).
//  - sinusoidal: the fixed table of Vaswani et al. added to the token embeddings:
//                PE[p, 2i] = sin(p / 10000^(2i/C)),  PE[p, 2i+1] = cos(p / 10000^(2i/C)).
//  - rope:       rotary embeddings applied to q and k in every attention layer (Su et al.), so the
//                score q·k depends only on the relative offset. Convention: SPLIT HALVES (GPT-NeoX,
//                LLaMA-HF): dimension i is paired with i + hs/2, not with its neighbour:
//                  out[i]        = x[i] cos(p θ_i) - x[i + hs/2] sin(p θ_i)
//                  out[i + hs/2] = x[i + hs/2] cos(p θ_i) + x[i] sin(p θ_i),  θ_i = base^(-2i/hs).
// The fixed tables are computed once and cached; none is a registered buffer, so none is saved.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <utility>

namespace nanogpt::model {

/// The sinusoidal table, (n_positions, C) fp32.
torch::Tensor sinusoidal_table(int64_t n_positions, int64_t n_embd);

/// Cached cos/sin tables for RoPE, fp32, moved to a device on demand. They start with block_size
/// positions and grow when asked for more: sampling with a sliding window (model/generate.h) keeps
/// counting positions past block_size.
class Rope {
 public:
  Rope(int64_t block_size, int64_t head_size, double base);

  /// Rotates x (B, T, H, hs) as positions start_pos .. start_pos + T - 1 (any number of heads H,
  /// so q and k can be rotated in one call). Same shape and dtype; on the CPU one fused pass
  /// (model/fast/rope.h), on a GPU one kernel each way (the CUDA plugin's, model/cuda/rope_kernel.h),
  /// elsewhere apply_reference.
  torch::Tensor apply(const torch::Tensor& x, int64_t start_pos);
  /// The same, returned as heads [0, n_first) (B, n_first, T, hs) and the rest (B, H - n_first, T, hs):
  /// queries and keys in the layout attention multiplies (contiguous where a fused pass ran).
  std::pair<torch::Tensor, torch::Tensor> apply_split(const torch::Tensor& x, int64_t start_pos, int64_t n_first);
  /// The rotation as the lesson writes it, three LibTorch kernels on any device with the tables in
  /// x's dtype: the definition the fused passes are tested against. (B, T, H, hs) as apply.
  torch::Tensor apply_reference(const torch::Tensor& x, int64_t start_pos);
  /// cos2 and sin2 (positions, 1, hs), at least n_positions rows, on `device` in `dtype` (the copy
  /// cached for the last device and dtype asked for): for hand-written kernels.
  std::pair<torch::Tensor, torch::Tensor> tables(int64_t n_positions, torch::Device device,
                                                 torch::ScalarType dtype = torch::kFloat);
  /// The fp32 CPU tables' rows for one position, hs values each (cos2 = [cos, cos],
  /// sin2 = [-sin, sin]): for hand-written kernels (decode_attention.h).
  const float* cos2_row(int64_t pos) { return cover(pos + 1), cos2_.data_ptr<float>() + pos * 2 * half_; }
  const float* sin2_row(int64_t pos) { return cover(pos + 1), sin2_.data_ptr<float>() + pos * 2 * half_; }

 private:
  /// Makes the tables hold at least n_positions rows (doubling, so growing one position at a time
  /// is amortised O(1)).
  void cover(int64_t n_positions);
  /// apply_split in one pass where the device has one (the CPU's, or the CUDA plugin's kernel when
  /// it is loaded and takes x); nullopt elsewhere.
  std::optional<std::pair<torch::Tensor, torch::Tensor>> fused_split(const torch::Tensor& x, int64_t start_pos,
                                                                     int64_t n_first);

  // out = x * cos2 + rotate_half(x) * sin2, with rotate_half(x) = [x2, x1] and the tables laid out
  // for the whole head: cos2 = [cos, cos], sin2 = [-sin, sin]. Three kernels instead of seven.
  torch::Tensor cos2_, sin2_;  // (positions, 1, hs): broadcast over heads, fp32
  torch::Tensor cos2_cast_, sin2_cast_;  // the same on the device and in the dtype last asked for
  int64_t half_;
  double base_;
};

}  // namespace nanogpt::model
