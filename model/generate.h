// Autoregressive sampling: temperature, top-k, top-p (nucleus), with or without the KV cache.
//
// Context longer than block_size: the model only ever sees the last tokens that fit. Without the
// cache (nanoGPT's way) every step re-runs the last block_size tokens. With the cache, when it is
// full it is rebuilt by one prefill of the last block_size / 2 tokens, so each token is predicted
// from between block_size / 2 and block_size tokens of context at O(1) amortised prefills per
// block_size / 2 tokens. Both paths see exactly the same context window at every step
// (window_start() below), so they produce the same tokens for the same seed.
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

/// Probabilities (V) after temperature, top-k and top-p, renormalised. logits: (V,) any float dtype.
torch::Tensor filtered_probs(const torch::Tensor& logits, const SamplingOptions& options);

/// Draws one token from `probs` (V, fp32/64, CPU) by inverse CDF with a uniform from `rng`.
int64_t draw_token(const torch::Tensor& probs, std::mt19937_64& rng);

/// Where the model's context window starts when `total` tokens exist (prompt + generated) and the
/// next token is being predicted. Shared by the cached and uncached paths.
int64_t window_start(int64_t total, int64_t block_size, bool use_cache);

/// Called after every step with the new token of each sequence (B). Return false to stop early.
using TokenCallback = std::function<bool(const std::vector<int64_t>& new_tokens)>;

/// Generates max_new_tokens for `batch` copies of `prompt` (non-empty token ids) in one batch.
/// Returns the full sequences (prompt + generated), one per row. Runs under InferenceMode.
std::vector<std::vector<int64_t>> generate(GPT& model, const std::vector<int64_t>& prompt, int64_t batch,
                                           int64_t max_new_tokens, const SamplingOptions& options,
                                           std::mt19937_64& rng, const TokenCallback& on_token = nullptr);

}  // namespace nanogpt::model
