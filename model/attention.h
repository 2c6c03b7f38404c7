// Causal multi-head self-attention, written as taught: explicit Q, K, V and output projections,
// softmax(Q Kᵀ / √hs) V under a causal mask, several heads. Grouped-query attention: K and V have
// n_kv_head heads, each shared by n_head / n_kv_head query heads (n_kv_head = n_head is plain MHA).
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>

#include "model/config.h"
#include "model/fast/dropout.h"
#include "model/layers.h"
#include "model/positions.h"

namespace nanogpt::model {

/// Per-call inputs beyond x: where the positions start, the KV cache slots of this layer, and
/// whether to hand back the attention weights.
struct AttentionContext {
  int64_t start_pos = 0;             // absolute position of x's first token
  Rope* rope = nullptr;              // rotary tables when pos_encoding == rope
  torch::Tensor* k_cache = nullptr;  // (B, nkv, block_size, hs) ring: position p in slot p % block_size; nullptr = no cache
  torch::Tensor* v_cache = nullptr;
  torch::Tensor* weights = nullptr;  // receives (B, nh, T, Tk) softmax weights (forces the math path)
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const ModelConfig& config, Fill fill = Fill::random);

  static constexpr double qk_norm_eps = 1e-6;  // QK-norm: q / sqrt(mean(q²) + eps), per head

  /// x (B, T, C) -> (B, T, C): project, (QK-norm,) rotate, score, mask, softmax, weigh, project.
  /// With a cache, positions start_pos .. start_pos + T - 1 are appended to it and attend to every
  /// position it holds (at most the last block_size). Only a single token may wrap around the ring:
  /// past block_size the oldest position makes room (a sliding window, for RoPE; see generate.h).
  torch::Tensor forward(const torch::Tensor& x, const AttentionContext& ctx = {});

  Linear q_proj{nullptr};  // C -> nh * hs
  Linear k_proj{nullptr};  // C -> nkv * hs
  Linear v_proj{nullptr};  // C -> nkv * hs
  Linear c_proj{nullptr};  // C -> C, the output projection

  /// While frozen, Q/K/V use one concatenated copy of their weights made now, instead of
  /// concatenating at every call (for sampling, where no weight changes: one token's decode would
  /// otherwise copy all three matrices). Unfreeze before the weights change again.
  void freeze_qkv_weights(bool frozen);

 private:
  /// One token per sequence, decoding on the CPU in fp32 without autograd: the same arithmetic as
  /// forward in one pass (model/fast/decode_attention.h).
  bool decodes_on_cpu(const torch::Tensor& x, const AttentionContext& ctx) const;
  torch::Tensor decode_one_token(const torch::Tensor& x, const AttentionContext& ctx);
  /// Writes k, v (B, nkv, T, hs) into the cache's slots and returns every filled slot, (B, nkv, Tk, hs).
  std::pair<torch::Tensor, torch::Tensor> append_to_cache(const torch::Tensor& k, const torch::Tensor& v,
                                                          const AttentionContext& ctx);
  /// Score, mask, softmax, weigh: softmax(Q Kᵀ / √hs + causal mask) V, step by step (the lesson).
  torch::Tensor math_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               int64_t start_pos, torch::Tensor* weights_out);
  torch::Tensor causal_mask(int64_t start_pos, int64_t T, int64_t Tk, torch::Device device);  // (T, Tk) bool
  std::pair<torch::Tensor, torch::Tensor> qkv_weights();  // [W_q; W_k; W_v] and the biases, or undefined
  torch::Tensor causal_bias(int64_t start_pos, int64_t T, int64_t Tk, torch::Device device);  // (T, Tk) 0 / -inf
  /// Makes `cache` a (B, nkv, block, hs) buffer of `options`, keeping the slots filled before start_pos.
  void ensure_cache(torch::Tensor& cache, int64_t B, const torch::TensorOptions& options, int64_t start_pos);

  int64_t n_head_, n_kv_head_, head_size_, block_size_;
  bool qk_norm_;
  double dropout_;
  std::string attention_;  // math | sdpa | chunked | flash | auto (model/config.h)
  Dropout attn_dropout{nullptr}, resid_dropout{nullptr};
  torch::Tensor mask_;  // (block_size, block_size) bool, true above the diagonal; cached, not a buffer
  torch::Tensor bias_;  // the same as an additive fp32 bias (0 / -inf); cached, not a buffer
  torch::Tensor frozen_w_, frozen_b_;  // [W_q; W_k; W_v] and biases while frozen, else undefined
};
TORCH_MODULE(CausalSelfAttention);

}  // namespace nanogpt::model
