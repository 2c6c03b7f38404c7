// StaticDecoder: sequences in the slots of a static KV cache (model/static_cache.h), one token for
// the first n slots a step, the sampling (model/device_sampling.h) done on the device in the same
// step. Only the new token ids come back to the host, as one small copy a step. The step touches
// fixed buffers only, so on CUDA it is captured once per batch-size bucket (1, 2, 4, ... up to the
// slots) as a graph and replayed for every token (StepGraphs, given by the CUDA plugin: model/cuda/
// decode_graph.h); a step of n sequences replays the bucket at or above n, the rows past n idle.
//
// A sequence enters a slot through start(): the last W tokens of its context but the newest go
// through the model's general path (a prefill, eager), the newest is the next step's input; W, the
// window, is block_size or a shorter max_context, and a slot's cache holds W positions. Positions
// then count on the device. With RoPE the window slides (model/generate.h, W wide); with learned or
// sinusoidal positions, or `exact_window`, a sequence whose window is full is start()ed again with
// its whole context before its next step (needs_restart), as generate() recomputes it: every token
// is then predicted from exactly the last W tokens, as sample.py with a block_size of W would.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/device_sampling.h"
#include "model/generate.h"
#include "model/sampling_mode.h"
#include "model/static_cache.h"

namespace nanogpt::model {

/// Records a step once per bucket and replays it (CUDA graphs). The decoder runs its steps eagerly
/// without one.
class StepGraphs {
 public:
  virtual ~StepGraphs() = default;
  /// Records `step` as bucket's graph; `step` has run once eagerly (libraries set up). Throws
  /// when the device cannot capture it.
  virtual void capture(int64_t bucket, const std::function<void()>& step) = 0;
  /// Runs bucket's recorded step again.
  virtual void replay(int64_t bucket) = 0;
};

class StaticDecoder {
 public:
  /// `slots` sequences at most (rounded up to a bucket) of `model` (on its device), the products in
  /// `dtype` (kFloat, or kBFloat16 with the weights converted once). `exact_window`: as
  /// SamplingOptions. `max_context`: the window and each slot's cache length, in [1, block_size]
  /// (0 = block_size). `generator`: for the draws (the device's default when none: the one a CUDA
  /// graph may use). Holds the model in sampling mode for its lifetime.
  StaticDecoder(GPT& model, int64_t slots, torch::ScalarType dtype, bool exact_window, int64_t max_context = 0,
                std::optional<torch::Generator> generator = std::nullopt);
  ~StaticDecoder();
  StaticDecoder(const StaticDecoder&) = delete;
  StaticDecoder& operator=(const StaticDecoder&) = delete;

  /// The bucket a step of n sequences runs: the smallest power of two >= n.
  static int64_t bucket(int64_t n);
  int64_t slots() const { return cache_.slots(); }
  /// The tokens a prediction sees at most: block_size or the max_context given, each slot's cache length.
  int64_t window() const { return cache_.length(); }

  /// Captures every bucket's step with `graphs`. Returns "" when all were captured, else why not
  /// (the steps then run eagerly).
  std::string capture(std::unique_ptr<StepGraphs> graphs);
  bool graphed() const { return graphs_ != nullptr; }

  /// Puts `context` (the sequence so far, non-empty) in `slot`, to be continued by the next step.
  void start(int64_t slot, const std::vector<int64_t>& context);
  /// The sampling options `slot`'s draws use (validated).
  void set_options(int64_t slot, const SamplingOptions& options);
  /// Slot `from`'s sequence moved to slot `to` (keeping the sequences in the first slots).
  void move(int64_t from, int64_t to);
  /// Whether slot's next token needs start() again with the whole context (its window is full and
  /// does not slide).
  bool needs_restart(int64_t slot) const;

  /// One token for each of slots [0, n): their ids, -1 for a row whose logits were not finite
  /// (NaN or inf: that sequence must leave).
  std::vector<int64_t> step(int64_t n);
  /// The last step's logits, and the distributions its tokens were drawn from, (n, V) fp32 on the CPU.
  torch::Tensor logits(int64_t n) const;
  torch::Tensor probs(int64_t n) const;

 private:
  void run_step(int64_t bucket);  // what a graph records: tensor operations on fixed buffers

  GPT& model_;
  SamplingMode mode_;
  torch::Device device_;
  bool sliding_;
  DecodeWeights weights_;
  StaticKVCache cache_;
  RowOptions options_;
  torch::Tensor tokens_;   // (S,) int64: each slot's next input token
  torch::Tensor drawn_;    // (S,) int64: the last step's tokens, -1 where not finite
  torch::Tensor logits_;   // (S, V) fp32: the last step's logits
  torch::Tensor probs_;    // (S, V) fp32: what they were drawn from
  std::vector<int64_t> position_;  // each slot's pos, mirrored on the host
  std::optional<torch::Generator> generator_;
  std::unique_ptr<StepGraphs> graphs_;
};

/// generate() through `decoder` (built with options.exact_window; one slot a sample, batch <= its
/// slots): the same arguments and callback, the draws from the decoder's generator instead of an
/// mt19937 (greedy, its tokens are generate()'s; sampled, they follow the same distributions). The
/// callback's probs are undefined unless `with_probs` (a copy of (B, V) a step).
std::vector<std::vector<int64_t>> generate_static(StaticDecoder& decoder, const std::vector<int64_t>& prompt,
                                                  int64_t batch, int64_t max_new_tokens, const SamplingOptions& options,
                                                  const TokenCallback& on_token = nullptr, bool with_probs = false);

}  // namespace nanogpt::model
