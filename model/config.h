// ModelConfig: everything that fixes the architecture. Stored inside every checkpoint.
//
// Shape legend used throughout model/:
//   B batch, T sequence length, C n_embd, nh n_head, nkv n_kv_head, hs head size (C / nh), V vocab.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace nanogpt::model {

struct ModelConfig {
  int64_t vocab_size = 65;          // number of distinct characters
  int64_t block_size = 256;         // maximum context length T
  int64_t n_layer = 6;              // transformer blocks
  int64_t n_head = 6;               // query heads
  int64_t n_kv_head = 0;            // key/value heads (grouped-query attention); 0 means n_head
  int64_t n_embd = 384;             // model width C
  double dropout = 0.0;             // embedding, attention and residual dropout probability
  bool bias = false;                // biases in Linear layers and LayerNorm (nanoGPT's char preset: false)
  std::string pos_encoding = "rope";   // rope | sinusoidal | learned
  double rope_base = 10000.0;       // RoPE frequency base
  std::string norm = "layernorm";   // layernorm | rmsnorm
  std::string attention = "auto";   // math (the lesson, written out) | sdpa (LibTorch's fused kernels) | chunked (math in cache-sized chunks, weights recomputed in backward) | flash (blocked online softmax on the CPU, no (T, T) scores; sdpa elsewhere) | auto (math or, for large T, chunked to train on a CPU; else sdpa)
  // Beyond nanoGPT's recipe (nanochat, modded-nanogpt); the defaults are nanoGPT's.
  bool qk_norm = false;             // RMS-normalise each head's queries and keys (no weight) before RoPE
  std::string mlp = "gelu";         // gelu (nanoGPT) | gelu_tanh (GPT-2's tanh approximation) | relu2 (ReLU squared) | swiglu (SiLU-gated, LLaMA)
  bool tie_embeddings = true;       // the head reuses wte's weights (nanoGPT); false = a separate lm_head
  double logit_softcap = 0.0;       // > 0: logits = cap * tanh(logits / cap), bounded by ±cap; 0 = off
  // Imported models (GPT-2, Llama) fix these; the defaults are ours.
  double norm_eps = 1e-5;           // added to the variance (layernorm) or the mean square (rmsnorm)
  int64_t mlp_width = 0;            // the MLP's hidden width H; 0 = the rule below (Llama's intermediate_size sets it)

  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int64_t head_size() const { return n_embd / n_head; }
  /// The MLP's hidden width: 4 C, or for swiglu 8 C / 3 rounded up to a multiple of 8, so that its
  /// three matrices hold about as many parameters as the other MLPs' two.
  int64_t mlp_hidden() const {
    if (mlp_width > 0) return mlp_width;
    return mlp == "swiglu" ? (8 * n_embd / 3 + 7) / 8 * 8 : 4 * n_embd;
  }

  /// Throws std::invalid_argument "[model] n_embd (384) must be divisible by n_head (5)" etc.
  void validate() const;
};

/// The one JSON mapping of the architecture (checkpoints and exports): every field, by its name.
nlohmann::ordered_json to_json(const ModelConfig& config);
/// The reverse; throws std::invalid_argument "[model] model config lacks 'n_head'" (or names a
/// field of the wrong type). The switches beyond nanoGPT's recipe (qk_norm, mlp, tie_embeddings,
/// logit_softcap, norm_eps, mlp_width) may be absent, as in files written before them: absent means the default.
/// Does not validate: call validate().
ModelConfig model_config_from_json(const nlohmann::ordered_json& json);

}  // namespace nanogpt::model
