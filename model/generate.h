// Autoregressive sampling: temperature, top-k, top-p (nucleus), with or without the KV cache.
//
// Context longer than block_size. nanoGPT's sample.py predicts every token from exactly the last
// block_size tokens, recomputed from scratch. What we do depends on the position encoding:
//  - learned, sinusoidal (and `exact_window`): the same. Once the sequence outgrows block_size, every
//    new token re-runs the last block_size tokens (one prefill of the cache per token), so it costs
//    a whole window's forward instead of one position's.
//  - rope: the KV cache slides. It keeps the last block_size positions and each new token
//    overwrites the oldest (model/kv_cache.h); positions keep counting, and because a RoPE score
//    depends only on the offset between query and key, the first layer computes exactly what a
//    recompute of the last block_size tokens would, at one position's cost. Deeper layers differ:
//    an old token's cached key was computed when its own window reached further back, so it carries
//    context from tokens that a recompute would no longer see (as in Transformer-XL). The logits are
//    therefore close to, not equal to, sample.py's for a model of more than one layer
//    (README "Sampling past block_size" gives the measured difference); `exact_window` gives sample.py's.
// Without the cache (`use_cache = false`) every token is a recompute of the last block_size tokens.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "model/fast/decoder.h"
#include "model/gpt.h"

namespace nanogpt::model {

struct SamplingOptions {
  double temperature = 0.8;  // > 0; 0 means greedy (argmax)
  int64_t top_k = 200;       // keep the k most likely tokens; 0 = off
  double top_p = 1.0;        // keep the smallest set whose probability reaches top_p; 1 = off
  bool use_cache = true;     // KV cache (fast) or full recompute (nanoGPT's sample.py)
  bool exact_window = false; // RoPE past block_size: recompute the last block_size tokens instead of sliding
  bool fast_decoder = true;  // one new token on the CPU in fp32: model/fast/decoder.h; false = the general path (the reference)
  /// The decoder's matrices in int8 or int4 and their inputs in int8 (model/fast/decoder.h):
  /// faster, slightly less exact. Needs the decoder: the CPU, fp32 or bf16, the KV cache. The
  /// prompt's prefill, and with learned or sinusoidal positions every window past block_size, still
  /// run the general path.
  Quantize quantize = Quantize::none;

  /// Throws std::invalid_argument ("[sample] ...") naming the first bad field.
  void validate() const;
};

/// Probabilities after temperature, top-k and top-p, renormalised along the last dim.
/// logits: (V,) or (B, V), any float dtype; returns fp32 of the same shape. temperature 0 = one-hot argmax.
/// Contiguous fp32 logits on the CPU without top-p take plain loops over the rows (sampling's case);
/// everything else takes filtered_probs_tensors.
torch::Tensor filtered_probs(const torch::Tensor& logits, const SamplingOptions& options);
/// The same in LibTorch's tensor operations, for any case: the reference the loops are tested against.
torch::Tensor filtered_probs_tensors(const torch::Tensor& logits, const SamplingOptions& options);

/// Draws one token from `probs` (V, fp32/64, CPU) by inverse CDF with a uniform from `rng`.
int64_t draw_token(const torch::Tensor& probs, std::mt19937_64& rng);

/// Called after every step with the new token of each sequence (B) and the distribution each was
/// drawn from, (B, V) fp32 on the CPU (after temperature, top-k and top-p). Return false to stop early.
using TokenCallback = std::function<bool(const std::vector<int64_t>& new_tokens, const torch::Tensor& probs)>;

/// Generates max_new_tokens for `batch` copies of `prompt` (non-empty token ids) in one batch.
/// Returns the full sequences (prompt + generated), one per row. Runs under InferenceMode in eval
/// mode and leaves the model in the mode it found it. Non-finite logits are an error
/// (std::runtime_error), never a token.
std::vector<std::vector<int64_t>> generate(GPT& model, const std::vector<int64_t>& prompt, int64_t batch,
                                           int64_t max_new_tokens, const SamplingOptions& options,
                                           std::mt19937_64& rng, const TokenCallback& on_token = nullptr);

/// One sequence among others that come and go (continuous batching: `nanogpt serve`): its tokens so
/// far, its own KV cache, its sampling options and its own random stream.
struct Sequence {
  std::vector<int64_t> tokens;  // prompt (non-empty) + generated
  SamplingOptions options;      // use_cache and quantize are the stepper's: a sequence always has its cache
  std::mt19937_64 rng;
  KVCache cache;                // filled by the stepper; empty for a new sequence
};

/// Steps a changing set of sequences one token each. Every step, the sequences that have only one
/// new position go through the decoder together (model/fast/decoder.h: one pass over the weights
/// for all of them, each at its own position and cache); a new sequence's prompt, or a window that
/// moved, is a prefill through the general path on its own, as in generate(). A sequence's tokens
/// are therefore those generate() draws for it with the same options and random stream, whatever
/// else is in the batch. Holds the model in eval mode for its lifetime; one thread at a time.
class SequenceStepper {
 public:
  explicit SequenceStepper(GPT& model, Quantize quantize = Quantize::none);
  ~SequenceStepper();
  SequenceStepper(const SequenceStepper&) = delete;
  SequenceStepper& operator=(const SequenceStepper&) = delete;

  struct Step {
    torch::Tensor logits;  // (B, V) fp32 CPU: the model's, before temperature (for log-probabilities)
    torch::Tensor probs;   // (B, V) fp32 CPU: what each new token was drawn from (after its row's filters)
    std::vector<int64_t> non_finite;  // rows whose logits held NaN or inf: no token drawn (probs all 0)
  };
  /// Draws one token for each sequence (non-empty) and appends it to its tokens. Throws
  /// std::invalid_argument for a bad sequence (empty, bad options). A sequence whose logits are not
  /// finite (NaN or inf: damaged weights, or a diverged run) fails alone: it gets no token, its row
  /// is listed in `non_finite`, and its cache holds a position its tokens lack (drop the sequence).
  Step step(const std::vector<Sequence*>& batch);

  /// Packs the decoder's weights now rather than at the first step that needs them (tens of
  /// milliseconds on the full-preset model: serve does it before its first request). Call it on the
  /// thread that steps, under the autocast that the steps run under.
  void prepare();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// One result of beam search.
struct Beam {
  std::vector<int64_t> tokens;  // prompt + generated
  double log_prob = 0.0;        // sum of the generated tokens' log-probabilities (the model's, temperature 1)
  int64_t generated = 0;        // tokens generated
  /// What beams are ranked by: log_prob, or log_prob per generated token when length-normalised.
  double score(bool length_normalize) const {
    return length_normalize && generated > 0 ? log_prob / static_cast<double>(generated) : log_prob;
  }
};

struct BeamOptions {
  int64_t width = 4;              // beams kept at every step; 1 = greedy
  bool length_normalize = false;  // rank finished beams by mean log-probability per token
  bool exact_window = false;      // as SamplingOptions::exact_window
  bool fast_decoder = true;       // as SamplingOptions::fast_decoder
  Quantize quantize = Quantize::none;  // as SamplingOptions::quantize
  int64_t max_context = 0;        // each step sees the last max_context tokens, recomputed once full; 0 = block_size
};

/// Beam search: at every step each of the `width` best partial sequences is extended by every
/// token, and the `width` most probable extensions (total log-probability) are kept. A beam for
/// which `finished(tokens)` holds (e.g. it reached a stop string) stops growing; the search ends when
/// `width` beams have finished or after max_new_tokens. Returns up to `width` beams, best first.
/// The KV cache holds one row per beam and is reordered as beams are kept.
std::vector<Beam> beam_search(GPT& model, const std::vector<int64_t>& prompt, int64_t max_new_tokens,
                              const BeamOptions& options,
                              const std::function<bool(const std::vector<int64_t>&)>& finished = nullptr);

}  // namespace nanogpt::model
