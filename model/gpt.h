// GPT: token embedding (+ positions), n_layer pre-norm blocks, final norm, a head tied to the
// token embedding (or its own lm_head when tie_embeddings is off), logits optionally soft-capped.
// Parameter names follow nanoGPT: wte, wpe, h.0.attn.q_proj, ..., ln_f, lm_head.
#pragma once

#include <torch/torch.h>

#include <utility>
#include <vector>

#include "model/block.h"
#include "model/config.h"
#include "model/fast/dropout.h"
#include "model/kv_cache.h"
#include "model/norm.h"
#include "model/positions.h"

namespace nanogpt::model {

class GPTImpl : public torch::nn::Module {
 public:
  /// initialise false leaves the parameters unset, for a model whose every parameter is loaded
  /// next: no GPT-2 initialisation (N(0, 0.02) weights, zero biases), and no random fill of the
  /// layers before it (model/layers.h); the random generator is not touched.
  explicit GPTImpl(const ModelConfig& config, bool initialise = true);

  /// idx (B, T) int64 token ids, T <= block_size.
  /// With targets (B, T): returns logits (B, T, V) and the mean cross-entropy loss (scalar, fp32).
  /// Soft-capped on the CPU, the cap is folded into the loss's one pass and those logits carry no
  /// gradient of their own (differentiate the loss, or take logits()).
  /// Without targets: logits of the last position only, (B, 1, V), and an undefined loss.
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& idx, const torch::Tensor& targets = {});

  /// forward(idx, targets)'s loss alone, for training: on the CPU in fp32 with gradients on (no
  /// autocast), the head and the loss go by chunks of rows and the (B, T, V) logits are never held
  /// (model/fast/cross_entropy.h: head_cross_entropy); elsewhere forward's.
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets);

  /// Logits at every position, (B, T, V).
  torch::Tensor logits(const torch::Tensor& idx);

  /// Attention weights of every layer, each (B, nh, T, T), rows = queries (math path, no dropout).
  std::vector<torch::Tensor> attention_maps(const torch::Tensor& idx);

  /// Incremental decoding: appends idx_new (B, T_new) to the cache and returns the logits of the
  /// last new position, (B, V). Positions continue from cache.length(), up to block_size; with RoPE
  /// a cache may go on one token at a time past block_size, each new token then replacing the
  /// oldest one (a sliding window: see model/generate.h).
  torch::Tensor forward_cached(const torch::Tensor& idx_new, KVCache& cache);

  /// An empty cache sized for this model.
  KVCache make_cache() const;

  /// Every attention layer's freeze_qkv_weights (see attention.h): on while sampling.
  void freeze_qkv_weights(bool frozen);

  /// Parameters, excluding learned position embeddings when non_embedding (nanoGPT's convention;
  /// the head is tied to wte, so wte counts once).
  int64_t num_params(bool non_embedding = true) const;

  /// Training FLOPs per token, nanoGPT's estimate: 6N + 12 * n_layer * n_head * head_size * T.
  double flops_per_token() const;

  const ModelConfig& config() const { return config_; }

 private:
  torch::Tensor embed(const torch::Tensor& idx, int64_t start_pos);  // (B, T) -> (B, T, C)
  torch::Tensor run_blocks(torch::Tensor x, int64_t start_pos, KVCache* cache, std::vector<torch::Tensor>* weights);
  void init_weights();
  torch::Tensor head(const torch::Tensor& x, bool capped = true);     // (B, T, C) -> (B, T, V)
  // forward's logits and loss from the last block's output x (B, T, C) and targets (B, T)
  std::pair<torch::Tensor, torch::Tensor> head_and_loss(const torch::Tensor& x, const torch::Tensor& targets);

  ModelConfig config_;
  Embedding wte{nullptr};  // (V, C), also the output head when tied
  Linear lm_head{nullptr}; // (V, C), the output head when not tied
  Embedding wpe{nullptr};  // (block_size, C), learned positions only
  Dropout drop{nullptr};
  torch::nn::ModuleList h{nullptr};   // n_layer Blocks
  Norm ln_f{nullptr};
  torch::Tensor sinusoid_;            // (block_size, C) cached table, sinusoidal only; not a buffer
  std::shared_ptr<Rope> rope_;        // cached cos/sin tables, rope only; not a buffer
};
TORCH_MODULE(GPT);

}  // namespace nanogpt::model
