// Autoregressive sampling: temperature, top-k, top-p (nucleus), with or without the KV cache.
//
// Context longer than block_size: the model only ever sees a window of the last tokens. Re-running
// the last block_size tokens for every new token (nanoGPT's sample.py) would defeat the cache, so
// the window slides in chunks: it starts at 0 until the sequence outgrows block_size; then, each
// time it would exceed block_size, it restarts at the last block_size / 2 tokens (one prefill).
// Every token is thus predicted from between block_size / 2 and block_size tokens of context.
// window_start() defines the rule; the cached and the uncached paths both follow it, so they
// produce the same logits and, for the same seed, the same tokens.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "model/gpt.h"

namespace nanogpt::model {

struct SamplingOptions {
  double temperature = 0.8;  // > 0; 0 means greedy (argmax)
  int64_t top_k = 200;       // keep the k most likely tokens; 0 = off
  double top_p = 1.0;        // keep the smallest set whose probability reaches top_p; 1 = off
  bool use_cache = true;     // KV cache (fast) or full recompute (nanoGPT's sample.py)
};

/// Probabilities after temperature, top-k and top-p, renormalised along the last dim.
/// logits: (V,) or (B, V), any float dtype; returns fp32 of the same shape. temperature 0 = one-hot argmax.
torch::Tensor filtered_probs(const torch::Tensor& logits, const SamplingOptions& options);

/// Draws one token from `probs` (V, fp32/64, CPU) by inverse CDF with a uniform from `rng`.
int64_t draw_token(const torch::Tensor& probs, std::mt19937_64& rng);

/// Where the model's context window starts when `total` tokens exist (prompt + generated) and the
/// next token is being predicted. Shared by the cached and uncached paths.
int64_t window_start(int64_t total, int64_t block_size);

/// Called after every step with the new token of each sequence (B). Return false to stop early.
using TokenCallback = std::function<bool(const std::vector<int64_t>& new_tokens)>;

/// Generates max_new_tokens for `batch` copies of `prompt` (non-empty token ids) in one batch.
/// Returns the full sequences (prompt + generated), one per row. Runs under InferenceMode.
std::vector<std::vector<int64_t>> generate(GPT& model, const std::vector<int64_t>& prompt, int64_t batch,
                                           int64_t max_new_tokens, const SamplingOptions& options,
                                           std::mt19937_64& rng, const TokenCallback& on_token = nullptr);

}  // namespace nanogpt::model
