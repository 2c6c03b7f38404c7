// A KV cache whose shape never changes, and the one-token forward over it: what a CUDA graph can
// capture once and replay for every token. The cache is preallocated for S sequences ("slots") of
// block_size positions each; slot s's next position lives in a device tensor (pos), the new keys and
// values are scattered in place at pos % block_size (a ring, as model/kv_cache.h), and attention
// reads every position of the slot with the ones not yet written masked out. Nothing in the step
// depends on a host value that changes from token to token, so replaying the same kernels with the
// same addresses decodes the next token. Written in LibTorch operations only: it runs (and is tested)
// on the CPU as on CUDA.
//
// Positions: RoPE's angle is computed from pos in double precision on the device (as the Rope tables
// are), so pos may count past L (the sliding window of model/generate.h, L positions wide); learned
// and sinusoidal tables are indexed at pos (the caller recomputes the window before pos reaches L,
// as generate() does at block_size).
#pragma once

#include <torch/torch.h>

#include <vector>

#include "model/gpt.h"
#include "model/kv_cache.h"

namespace nanogpt::model {

/// Keys and values of S slots, every layer, fixed shapes.
struct StaticKVCache {
  std::vector<torch::Tensor> k;  // per layer (S, nkv, L, hs), L <= block_size; zeros where never written
  std::vector<torch::Tensor> v;  // per layer (S, nkv, L, hs)
  torch::Tensor pos;             // (S,) int64: the position the slot's next token takes (= positions held, until it slides)

  /// Zeroed buffers for `slots` sequences of `length` positions (0: block_size; at most block_size)
  /// of `config`'s model in `options` (dtype and device).
  StaticKVCache(const ModelConfig& config, int64_t slots, const torch::TensorOptions& options, int64_t length = 0);
  StaticKVCache() = default;

  int64_t slots() const { return pos.size(0); }
  int64_t length() const { return k.front().size(2); }  // L: positions a slot holds
  /// Copies positions [0, n) of row `row` of a general cache (model->forward_cached's) into `slot`.
  /// Does not set pos.
  void load(int64_t slot, const KVCache& from, int64_t row, int64_t n);
  /// Slot `from`'s keys, values and position copied into slot `to` (to keep the busy slots first).
  void move(int64_t from, int64_t to);
};

/// The model's tensors the step reads, gathered (and converted to `dtype`, for the products) once.
struct DecodeWeights {
  struct Layer {
    torch::Tensor ln_1_w, ln_1_b, ln_2_w, ln_2_b;  // fp32 norms (bias undefined without)
    torch::Tensor w_qkv, b_qkv;                    // [W_q; W_k; W_v] (C + 2 nkv hs, C) in dtype, biases
    torch::Tensor w_o, b_o;                        // attention's output projection
    torch::Tensor w_fc, b_fc, w_proj, b_proj;      // the MLP's
  };
  ModelConfig config;
  torch::ScalarType dtype = torch::kFloat;  // the products' dtype; the residual stream stays fp32
  torch::Tensor wte;                        // (V, C) fp32, the embedding
  torch::Tensor head;                       // (V, C) in dtype: lm_head's, or wte's when tied
  torch::Tensor wpe;                        // (block, C) fp32: learned or sinusoidal table, undefined for RoPE
  torch::Tensor ln_f_w, ln_f_b;
  torch::Tensor inv_freq;                   // (hs/2,) double: RoPE's θ_i
  torch::Tensor key_index;                  // (block,) int64: 0 .. block-1, for the mask (its first L)
  std::vector<Layer> layers;

  /// The weights of `model` (on its device). dtype kFloat keeps them as they are (no copy but Q/K/V's
  /// concatenation); kBFloat16 or kHalf converts the matrices once.
  static DecodeWeights from(GPT& model, torch::ScalarType dtype);
};

/// One token for each of the first B slots: tokens (B,) int64 at positions cache.pos[0, B).
/// Writes each slot's keys and values at pos % L and returns the logits (B, V) fp32. Does not
/// advance pos. Only tensor operations: no host read, no shape depending on a value.
torch::Tensor decode_step(const DecodeWeights& w, StaticKVCache& cache, const torch::Tensor& tokens);

}  // namespace nanogpt::model
